// core/placement.h — Placement: where the values a tensor holds sit in the whole (global) tensor
// of a parallel layout, and which ranks hold the same ones. Set on a parameter by whoever shards
// or copies it (tensor-parallel layers, the pipeline's tied copy, data parallelism's replicas and
// shards); read by everything that needs the layout — the global gradient norm, tied-gradient
// sync, checkpoint shapes and offsets — so nothing parses names or casts layer types to find it.
// Plain data over mesh axis names ("tp", "dp", …, parallel/mesh.h); nothing here communicates.
//
// Note [Placement]: a tensor without a placement is the whole tensor, held once. A split dim d
// over axis "tp" holds `runs` of the global dim: a row-parallel weight one run [r·n, (r+1)·n),
// a fused qkv weight one run per segment (q, k, v: its rows are this rank's chunk of each).
// `replicated` lists the axes along which every rank holds these same values — and, once
// gradients are synchronised, the same gradients — so a sum over ranks counts them only at
// coordinate 0 of each such axis. Axes in neither list are ones the tensor does not span (a
// pipeline stage's parameters live at one pp coordinate). `tied_to` marks a copy of another
// parameter (the last stage's wte for the LM head): its gradient is summed into the primary's
// and it is neither counted nor saved.
//
// Note [Holders that no axis names]: some schemes give a value to k of the N ranks of an axis
// (SDP: a slice of a block's MLP to the k workers the cover draws), which `replicated` cannot
// say. Such a scheme marks on every holder but one (its choice, the same on every rank) the
// runs (PlacementRun::counted) or the whole tensor (Placement::counted) as not counted here:
// the global gradient norm and the checkpoint writer then count and store each element once
// (parallel/gradients.h), and no scheme writes its own norm or checkpoint rule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct PlacementRun {
  int64_t local = 0;   // first index along the dim in this rank's tensor
  int64_t global = 0;  // … and in the global tensor
  int64_t length = 0;
  bool counted = true;  // false: another holder's copy counts (Note [Holders that no axis names])
  bool operator==(const PlacementRun&) const = default;
};

struct PlacementSplit {
  int64_t dim = 0;
  std::string axis;  // the mesh axis the dim is split over
  std::vector<PlacementRun> runs;
  bool operator==(const PlacementSplit&) const = default;
};

struct Placement {
  std::vector<int64_t> global_shape;    // the whole tensor's shape
  std::vector<PlacementSplit> splits;   // at most one per dim
  std::vector<std::string> replicated;  // axes holding these same values (Note [Placement])
  std::string tied_to;                  // non-empty: a copy of that parameter
  bool counted = true;  // false: another holder's copy counts (Note [Holders that no axis names])

  // The split along `axis`, or null.
  const PlacementSplit* split_over(const std::string& axis) const;
  bool is_replicated_over(const std::string& axis) const;
  // Adds `axis` to `replicated` unless the tensor is split over it or it is there already.
  void add_replicated(const std::string& axis);
  // Takes `axis` out of `replicated` (the values along it become distinct shards).
  void remove_replicated(const std::string& axis);
  bool operator==(const Placement&) const = default;
};

// "global (768, 2304); dim 0 over tp: 0→0 (256), 256→768 (256), …; replicated over dp, cp".
std::string placement_str(const Placement& p);

}  // namespace loom
