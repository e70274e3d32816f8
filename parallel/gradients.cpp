// parallel/gradients.cpp — the global Σ g² from placements (see parallel/gradients.h).
#include "parallel/gradients.h"

#include "core/ops/view.h"
#include "optim/clip.h"
#include "parallel/parallel_context.h"

namespace loom::parallel {

std::vector<GradPiece> parameter_grad_pieces(const std::vector<Tensor>& params) {
  std::vector<GradPiece> out;
  for (const Tensor& p : params) {
    if (p.grad().defined()) out.push_back({p.grad(), p.placement()});
  }
  return out;
}

bool counted_here(const Placement& p, const ParallelContext* ctx) {
  if (!p.tied_to.empty()) return false;
  if (ctx == nullptr) return true;
  for (const std::string& axis : p.replicated) {
    if (ctx->axis_rank(axis) != 0) return false;
  }
  return true;
}

Tensor global_grad_sq_sum(const std::vector<GradPiece>& pieces, const ParallelContext* ctx,
                          Device device) {
  std::vector<Tensor> counted;
  for (const GradPiece& g : pieces) {
    if (counted_here(g.placement, ctx)) counted.push_back(g.grad);
  }
  Tensor sq = ops::reshape(optim::grad_sq_sum_tensor(counted, device), {1});
  if (ctx != nullptr && ctx->world_size() > 1) ctx->world().all_reduce(sq, ReduceOp::kSum);
  return ops::reshape(sq, {});
}

void mark_replicated(const std::vector<Tensor>& params, const std::string& axis) {
  for (Tensor p : params) {
    Placement pl = p.placement();
    pl.add_replicated(axis);
    p.set_placement(std::move(pl));
  }
}

}  // namespace loom::parallel
