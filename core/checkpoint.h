// core/checkpoint.h — activation checkpointing: a region whose intermediate activations are
// discarded after its forward and recomputed during backward: all of them (full), or all but
// the results of the ops it keeps (selective).
//
// Note [Activation checkpoint]: checkpoint(fn, inputs) runs fn once with recording on, walks
// the graph it built to find the parameters (leaves) it used, then drops that graph, keeping
// only the inputs. Its backward restores the random generators, re-runs fn, back-propagates
// through the fresh graph with the gradients of the region's inputs and parameters captured
// (not accumulated), and hands them on as its own input gradients. Parameters therefore still
// receive their gradient through their AccumulateGrad once, when it is final, so gradient-ready
// hooks fire exactly once. fn may use leaves it captures, but any tensor with history must be
// passed in `inputs`. Random ops inside fn must draw from the generators listed.
//
// Note [Selective recompute]: checkpoint(fn, inputs, generators, keep) with a non-empty `keep`
// recomputes only part of the region (Korthikanti et al. 2022; torchtitan's selective
// activation checkpointing). The ops of core/ops whose kind is in `keep` (matmul: every GEMM op,
// matmul, linear, linear_gelu, gelu_mlp; attention: causal_attention's output and lse) produce
// their results through kept_or_computed: during the region's forward those results are kept
// (a tape of the region, in call order, sharing their storage); during the recomputation in
// backward the same calls return them instead of computing, and only the other ops (norms,
// activations, RoPE, residual adds, dropout, the collectives) run again. An op that is a piece
// of another's forward (run with grad mode off, as the tensor-parallel layers run their GEMMs
// before reducing the results in place) is never kept itself: the enclosing op is (the
// tensor-parallel linears keep their output, collective included). What the region holds
// between its forward and its backward is its inputs and the kept results — the outputs the
// kept ops produced, never the inputs they save (a GEMM's input, a norm's output, is rebuilt by
// the recomputation). The recomputation must call the kept ops in the same order with the same
// shapes (checked): fn is deterministic given its inputs and generators, as full recompute
// already requires. The tape is found through a thread_local pointer set for exactly the calls
// of fn, like grad mode (Note [Grad mode is thread-local] in core/autograd.h); a checkpoint
// inside fn sets its own (or none), so regions never read each other's tapes. After the
// recomputation the tape is dropped: the fresh graph holds what its backward needs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace loom {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// The kinds of op a selective region keeps (Note [Selective recompute]); a set is their bits.
enum class KeptOp : uint32_t { kMatmul = 1u << 0, kAttention = 1u << 1 };
using KeptOps = uint32_t;
constexpr KeptOps kept_bit(KeptOp k) { return static_cast<KeptOps>(k); }
// "matmul,attention" → the set; throws naming `key` on an unknown or repeated word or an
// empty list. kept_ops_text is the inverse ("matmul,attention" in this order).
KeptOps parse_kept_ops(const std::string& text, const std::string& key);
std::string kept_ops_text(KeptOps keep);

// keep == 0: full recompute; otherwise selective (Note [Selective recompute]).
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               const std::vector<Generator*>& generators = {}, KeptOps keep = 0);

// For the ops of core/ops: compute()'s results, or, inside a selective region that keeps
// `kind`, the results its forward kept (Note [Selective recompute]). `compute` must return
// fresh tensors without history (the op records its node after this returns).
std::vector<Tensor> kept_or_computed(KeptOp kind,
                                     const std::function<std::vector<Tensor>()>& compute);

}  // namespace loom
