// parallel/gradients.cpp — the global Σ g² from placements (see parallel/gradients.h).
#include "parallel/gradients.h"

#include "core/ops/view.h"
#include "optim/clip.h"
#include "parallel/parallel_context.h"

namespace loom::parallel {

std::vector<HeldPiece> parameter_grad_pieces(
    const std::vector<std::pair<std::string, Tensor>>& params) {
  std::vector<HeldPiece> out;
  for (const auto& [name, p] : params) {
    if (!p.grad().defined()) continue;
    out.push_back({name, name, p.grad(), piece_of(p.placement(), p.shape()), p.placement()});
  }
  return out;
}

bool counted_here(const Placement& p, const ParallelContext* ctx) {
  if (!p.tied_to.empty() || !p.counted) return false;
  if (ctx == nullptr) return true;
  for (const std::string& axis : p.replicated) {
    if (ctx->axis_rank(axis) != 0) return false;
  }
  return true;
}

std::vector<CountedRun> counted_runs(const Tensor& values, const Placement& pl,
                                     const ParallelContext* ctx) {
  if (!counted_here(pl, ctx)) return {};
  const PlacementSplit* partial = nullptr;
  for (const PlacementSplit& s : pl.splits) {
    for (const PlacementRun& r : s.runs) {
      if (r.counted) continue;
      LOOM_CHECK(partial == nullptr || partial == &s,
                 "counted_runs: runs counted elsewhere on two dims of ", placement_str(pl));
      partial = &s;
    }
  }
  if (partial == nullptr) return {{values, {}, -1}};
  std::vector<CountedRun> out;
  for (const PlacementRun& r : partial->runs) {
    if (r.counted)
      out.push_back({ops::narrow(values, partial->dim, r.local, r.length), r, partial->dim});
  }
  return out;
}

std::optional<std::pair<Tensor, TensorPiece>> counted_part(const HeldPiece& p,
                                                           const ParallelContext* ctx) {
  const std::vector<CountedRun> runs = counted_runs(p.values, p.placement, ctx);
  if (runs.empty()) return std::nullopt;
  if (runs.size() == 1 && runs[0].dim < 0) return std::make_pair(p.values, p.piece);
  LOOM_CHECK(p.piece.begin == 0 && p.piece.end == p.values.numel(), "checkpoint: '", p.name,
             "' has runs counted elsewhere and is a flat range of its part");
  const size_t dim = static_cast<size_t>(runs[0].dim);
  TensorPiece piece = p.piece;
  piece.runs[dim].clear();
  std::vector<Tensor> parts;
  int64_t local = 0;
  for (const CountedRun& r : runs) {
    piece.runs[dim].push_back({local, r.run.global, r.run.length});
    parts.push_back(r.values);
    local += r.run.length;
  }
  Tensor packed = parts.size() == 1 ? ops::contiguous(parts[0]) : ops::cat(parts, runs[0].dim);
  piece.begin = 0;
  piece.end = packed.numel();
  return std::make_pair(packed, piece);
}

Tensor global_grad_sq_sum(const std::vector<HeldPiece>& pieces, const ParallelContext* ctx,
                          Device device) {
  std::vector<Tensor> counted;
  for (const HeldPiece& g : pieces) {
    for (CountedRun& r : counted_runs(g.values, g.placement, ctx)) counted.push_back(r.values);
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
