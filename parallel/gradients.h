// parallel/gradients.h — the global gradient norm of any layout, from placements. Every rank
// passes the gradients (or pieces of them) it holds, each with the Placement of the values it
// holds (core/placement.h); the one sum below counts each element of the global model's
// gradient exactly once, whatever splits it — tensor parallelism, pipeline stages, ZeRO shards,
// MiCS replicas, context parallelism — so no layout writes its own Σ g².
//
// Note [Global Σ g²]: a piece is counted on this rank iff it is not a tied copy and this rank
// sits at coordinate 0 of every axis the piece is replicated over (Note [Placement]). Each rank
// sums the squares of its counted pieces in f64, and one all-reduce over the world (a
// deterministic rank-order sum for MPI) gives every rank the same total, so every rank takes
// the same clipping and loss-scaling decision. Nothing is read back: the result stays on the
// device (Note [Device step] in train/train_step.cpp).
#pragma once

#include <vector>

#include "core/placement.h"
#include "core/tensor.h"

namespace loom::parallel {

class ParallelContext;

struct GradPiece {
  Tensor grad;          // the values this rank holds (a whole gradient, a part, a shard view)
  Placement placement;  // of those values
};

// The pieces of whole parameters: each parameter's gradient (skipped when undefined) with the
// parameter's placement.
std::vector<GradPiece> parameter_grad_pieces(const std::vector<Tensor>& params);

// Whether this rank counts `p`'s values in a sum over ranks (Note [Global Σ g²]). ctx null or
// of one rank: everything but tied copies.
bool counted_here(const Placement& p, const ParallelContext* ctx);

// Σ g² of the whole model (Note [Global Σ g²]) as a 0-d f64 tensor on `device`, the same on
// every rank. Collective over ctx's world (every rank calls it); ctx null: this process alone.
Tensor global_grad_sq_sum(const std::vector<GradPiece>& pieces, const ParallelContext* ctx,
                          Device device);

// Adds `axis` to the replicated axes of every parameter not split over it (the plain layers'
// parameters in a tensor-parallel model, every parameter of a data-parallel replica).
void mark_replicated(const std::vector<Tensor>& params, const std::string& axis);

}  // namespace loom::parallel
