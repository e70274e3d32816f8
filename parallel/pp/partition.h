// parallel/pp/partition.h — how the Transformer's layers are split into pipeline stages, and
// which stage each parameter belongs to. Pure arithmetic on sizes and names; it builds no model
// and does not communicate.
//
// Note [Pipeline partition]: the n_layer blocks go to the S = pp·vpp global stages in order
// (Note [Pipeline stages and chunks] in parallel/pp/schedule.h: which rank and chunk holds a
// stage is the schedule's placement, looping or zb-v's V), evenly (S must divide n_layer)
// or by parallel.pp_layout, a comma-separated list of S block counts, each ≥ 1, summing to
// n_layer (e.g. "3,3,2,2"). Stage 0 also holds the embeddings (wte, and wpe for gpt2); stage
// S−1 holds the final norm and the head (lm_head, or with tied embeddings its own copy of wte).
//
// Note [Tied embeddings across stages]: with tied embeddings and the first and the last stage
// on two ranks (S > 1 and not zb-v's V, which puts both on rank 0, where one tensor serves
// both and its gradient sums both parts) each holds wte.weight, initialised identically from
// the seed. Each stage's backward gives its copy part of the gradient (lookup on the first,
// head on the last); before the optimiser step the two ranks exchange their parts and both set
// grad = first + last (f32 addition is commutative, so both get the same bits), so both copies
// take identical steps and stay equal. The gradient norm counts the tied gradient once (on the
// first stage), and checkpoints store the parameter once (from the first stage). With sharded
// gradients (ZeRO-2/3) the exchange is of owned shards (Note [Sharded stages] in
// parallel/pp/pipeline.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::parallel::pp {

// Boundaries b (S+1 entries, b[0] = 0, b[S] = n_layer): stage s runs blocks [b[s], b[s+1]).
// Throws ConfigError naming parallel.pp / parallel.vpp / parallel.pp_layout / model.n_layer.
std::vector<int64_t> partition_layers(int64_t n_layer, int num_stages,
                                      const std::string& layout = "");

// The global stages holding parameter `p` (named `name`, for errors) by its ParamRole
// (core/param_role.h): one, or two for the tied input table (first and last; `tied_table`: p is
// the table the head reuses) when S > 1.
std::vector<int> stages_of_parameter(const std::string& name, const Tensor& p,
                                     const std::vector<int64_t>& boundaries, bool tied_table);

}  // namespace loom::parallel::pp
