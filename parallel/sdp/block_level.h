// parallel/sdp/block_level.h — SDP at the block level (subnetwork data parallelism, arXiv
// 2507.09029; docs/parallel.md, "SDP"): what a worker's model is built with, which parameters it
// holds, and the gradient-sync slices, from a block cover (assign_blocks, parallel/sdp/
// assignment.h). Pure functions: the model is built by layers/transformer.h from the context,
// the sync by parallel/sdp/sdp_sync.h from the slices; nothing here communicates.
//
// Note [SDP block masking]: worker w holds the C·n_layer blocks cover.owned_blocks(w).
//   forward masking   the worker's model builds only those blocks (Note [Block selection] in
//                     layers/build_context.h): a block not held is skipped through the residual
//                     path, and each held block's two residual branches are multiplied by
//                     s = 1/C = N/k, so that for any input of a block the full model's branch is
//                     the average over the N workers of their scaled branches (every block held
//                     by k workers; decision 2 of docs/parallel.md). Parameters, gradients and
//                     optimiser state are C·Ψ_blocks + Ψ_rest; the activations of C·n_layer
//                     blocks. Coverage 1: every block, s = 1: the default model bit for bit.
//   backward masking  every block is built and the forward is the full model's (s = 1); the
//                     blocks not held are frozen (requires_grad false: no weight gradient is
//                     formed, the input gradient still flows to the earlier blocks), and their
//                     values arrive by publication from their holders (decision 3).
// Parameter names are global ("blocks.<l>.…") under both, so checkpoints and the sync name the
// full model's tensors.
//
// Note [SDP block slices]: every parameter of block l is one whole sync slice held by
// cover.holders[l]; every other parameter (embeddings, final norm, head) one slice held by all
// N workers. Ids are global and the same on every worker whatever blocks its model holds: with
// P the parameters of a block (the same list in every block), parameter j of block l has id
// (n_layer − 1 − l)·P + j — the last block first, as backward finishes it first — and the
// replicated parameters follow in the model's order, ids n_layer·P + 0, 1, … (the same list on
// every worker: the non-block parameters do not depend on the selection).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/build_context.h"
#include "parallel/sdp/assignment.h"
#include "parallel/sdp/sdp_sync.h"

namespace loom::parallel::sdp {

// A default LayerContext (one device) with worker `worker`'s block selection (Note [SDP block
// masking]): forward masking holds cover.owned_blocks(worker) with residual scale N/k; backward
// masking holds every block, scale 1, and freezes the blocks the worker does not hold.
LayerContext block_masking_context(const BlockAssignment& cover, int worker, bool forward_masking);

// The block of parameter `p` (named `name`, for errors) by its ParamRole (core/param_role.h), or
// -1 outside the blocks. An error naming the parameter when it has no role (not a model's) or
// its block is not one of a model of n_layer blocks.
int64_t block_of_parameter(const std::string& name, const Tensor& p, int64_t n_layer);

// Whether worker `worker` holds (trains) parameter `p` (named `name`): a block parameter iff
// the worker holds its block; every other parameter is replicated (true).
bool holds_parameter(const BlockAssignment& cover, int worker, const std::string& name,
                     const Tensor& p);

// The sync slices of `params` (a worker's named parameters, any subset of blocks; Note [SDP
// block slices]): one whole slice (length −1) per parameter, ascending id, holders ascending.
// Every block parameter present gets its slice, held by this worker or not (the caller filters
// by holders). Errors name the parameter when the blocks present list different parameters.
std::vector<SdpSliceSpec> block_slices(const BlockAssignment& cover,
                                       const std::vector<std::pair<std::string, Tensor>>& params);

// What SdpSync needs at the block level (Note [SDP setup] in parallel/sdp/sdp_sync.h): the
// slices of the trained parameters (`params`: the replicated ones and the held blocks') and,
// under backward masking, of the frozen blocks' parameters (`frozen`, global names; empty under
// forward masking, whose model has no unheld block).
SdpSetup block_setup(const BlockAssignment& cover, int worker,
                     const std::vector<std::pair<std::string, Tensor>>& params,
                     std::vector<std::pair<std::string, Tensor>> frozen, bool forward_masking);

}  // namespace loom::parallel::sdp
