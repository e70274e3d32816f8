// parallel/diloco/options.cpp — DiLoCo's option checks and its fragment schedule (see the
// header).
#include "parallel/diloco/options.h"

#include "core/error.h"

namespace loom::parallel::diloco {

void validate(const DilocoOptions& o, const DilocoLayout& layout) {
  if (!o.on()) return;
  LOOM_CONFIG_CHECK(o.islands >= 1, "parallel.diloco.islands: must be ≥ 1 (got ", o.islands, ")");
  LOOM_CONFIG_CHECK(o.island >= 0 && o.island < o.islands, "parallel.diloco.island: ", o.island,
                    " is not an island of parallel.diloco.islands ", o.islands, " (0..",
                    o.islands - 1, ")");
  LOOM_CONFIG_CHECK(!o.rendezvous.empty(),
                    "parallel.diloco.rendezvous: islands meet through a directory they all "
                    "reach; set it (one per job)");
  LOOM_CONFIG_CHECK(o.inner_steps >= 1, "parallel.diloco.inner_steps: must be ≥ 1 (got ",
                    o.inner_steps, ")");
  LOOM_CONFIG_CHECK(o.outer == "nesterov" || o.outer == "sgd" || o.outer == "average",
                    "parallel.diloco.outer: '", o.outer, "' (nesterov, sgd or average)");
  LOOM_CONFIG_CHECK(o.outer_lr > 0, "parallel.diloco.outer_lr: must be > 0 (got ", o.outer_lr, ")");
  LOOM_CONFIG_CHECK(o.outer_momentum >= 0 && o.outer_momentum < 1,
                    "parallel.diloco.outer_momentum: must be in [0, 1) (got ", o.outer_momentum,
                    ")");
  LOOM_CONFIG_CHECK(o.fragments >= 1 && o.fragments <= o.inner_steps,
                    "parallel.diloco.fragments: must be in 1..inner_steps ", o.inner_steps,
                    " (got ", o.fragments, ")");
  LOOM_CONFIG_CHECK(o.inner_steps % o.fragments == 0, "parallel.diloco.fragments: ", o.fragments,
                    " must divide parallel.diloco.inner_steps ", o.inner_steps,
                    " (the fragments sync at offsets H/P apart)");
  LOOM_CONFIG_CHECK(
      o.overlap_steps >= 0 && o.overlap_steps < o.inner_steps / o.fragments,
      "parallel.diloco.overlap_steps: must be in 0..", o.inner_steps / o.fragments - 1,
      " (a fragment's exchange ends before the next fragment's starts; got ", o.overlap_steps, ")");
  LOOM_CONFIG_CHECK(o.fragment_alpha >= 0 && o.fragment_alpha < 1,
                    "parallel.diloco.fragment_alpha: must be in [0, 1) (got ", o.fragment_alpha,
                    ")");
  LOOM_CONFIG_CHECK(o.quantize == "none" || o.bits() != 0, "parallel.diloco.quantize: '",
                    o.quantize, "' (none, int8 or int4)");
  LOOM_CONFIG_CHECK(o.quantize_scaling == "block" || o.quantize_scaling == "row",
                    "parallel.diloco.quantize_scaling: '", o.quantize_scaling, "' (block or row)");
  LOOM_CONFIG_CHECK(o.quantize_block >= 1, "parallel.diloco.quantize_block: must be ≥ 1 (got ",
                    o.quantize_block, ")");
  LOOM_CONFIG_CHECK(o.lanes >= 0 && o.lanes <= layout.world,
                    "parallel.diloco.lanes: must be in 0..", layout.world,
                    " (the island's ranks; got ", o.lanes, ")");
  LOOM_CONFIG_CHECK(o.quorum_timeout_s > 0 && o.join_timeout_s > 0,
                    "parallel.diloco.quorum_timeout_s and join_timeout_s: must be > 0");
  LOOM_CONFIG_CHECK(!layout.sdp,
                    "parallel.diloco: not supported with SDP (parallel.sdp.mode) inside an island");
}

std::vector<FragmentRange> fragment_ranges(int64_t block, const Shape& shape, int64_t fragments) {
  const int64_t numel = shape_numel(shape);
  if (block >= 0) return {{block % fragments, 0, numel}};
  const int64_t rows = shape.empty() ? 1 : shape[0], row = rows > 0 ? numel / rows : 0;
  std::vector<FragmentRange> out;
  for (int64_t f = 0; f < fragments; ++f) {
    const int64_t b = rows * f / fragments, e = rows * (f + 1) / fragments;
    if (b < e) out.push_back({f, b * row, e * row});
  }
  return out;
}

bool syncs_at(const DilocoOptions& o, int64_t step, int64_t fragment) {
  const int64_t offset = fragment * (o.inner_steps / o.fragments);
  return step > 0 && step >= offset && (step - offset) % o.inner_steps == 0;
}

}  // namespace loom::parallel::diloco
