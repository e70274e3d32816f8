// parallel/gradients.h — the global gradient norm of any layout, from placements. Every rank
// passes the gradients (or pieces of them) it holds, each with the Placement of the values it
// holds (core/placement.h); the one sum below counts each element of the global model's
// gradient exactly once, whatever splits it — tensor parallelism, pipeline stages, ZeRO shards,
// MiCS replicas, context parallelism — so no layout writes its own Σ g².
//
// Note [Global Σ g²]: a piece is counted on this rank iff it is not a tied copy, not marked as
// counted elsewhere, and this rank sits at coordinate 0 of every axis the piece is replicated
// over (Note [Placement] in core/placement.h); of a counted piece, only its counted runs (Note
// [Holders that no axis names] in core/placement.h). Each rank
// sums the squares of its counted pieces in f64, and one all-reduce over the world (a
// deterministic rank-order sum for MPI) gives every rank the same total, so every rank takes
// the same clipping and loss-scaling decision. Nothing is read back: the result stays on the
// device (Note [Device step] in train/train_step.cpp).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/placement.h"
#include "core/tensor.h"
#include "core/tensor_piece.h"

namespace loom::parallel {

class ParallelContext;

// The gradients of whole parameters as pieces (values: the gradient; skipped when undefined),
// with each parameter's placement.
std::vector<HeldPiece> parameter_grad_pieces(
    const std::vector<std::pair<std::string, Tensor>>& params);

// Whether this rank counts `p`'s values in a sum over ranks (Note [Global Σ g²]). ctx null or
// of one rank: everything but tied copies and copies counted elsewhere.
bool counted_here(const Placement& p, const ParallelContext* ctx);

// The values of a whole local tensor (under placement `pl`) this rank counts, as views: the
// tensor itself, or, when some runs of its split are counted elsewhere, one view per counted
// run (with the run). Empty when counted_here is false.
struct CountedRun {
  Tensor values;
  PlacementRun run;  // along `dim`; run.local is the run's index in the local tensor
  int64_t dim = -1;  // -1: the whole tensor
};
std::vector<CountedRun> counted_runs(const Tensor& values, const Placement& pl,
                                     const ParallelContext* ctx);

// What a checkpoint stores of `p` on this rank: nothing (another copy counts), p itself, or its
// counted runs gathered into one contiguous tensor with the piece that says where they lie.
std::optional<std::pair<Tensor, TensorPiece>> counted_part(const HeldPiece& p,
                                                           const ParallelContext* ctx);

// Σ g² of the whole model (Note [Global Σ g²]) as a 0-d f64 tensor on `device`, the same on
// every rank: the pieces' values are the gradients. Collective over ctx's world (every rank
// calls it); ctx null: this process alone.
Tensor global_grad_sq_sum(const std::vector<HeldPiece>& pieces, const ParallelContext* ctx,
                          Device device);

// Adds `axis` to the replicated axes of every parameter not split over it (the plain layers'
// parameters in a tensor-parallel model, every parameter of a data-parallel replica).
void mark_replicated(const std::vector<Tensor>& params, const std::string& axis);

}  // namespace loom::parallel
