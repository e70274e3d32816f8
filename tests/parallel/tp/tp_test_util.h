// tests/parallel/tp/tp_test_util.h — the tensor-parallel layout restated by parameter name for the
// tests (independently of parallel/tp/layers.cpp): which part of an unsharded Transformer
// parameter TP rank r of n holds. Tests only.
#pragma once

#include <string>
#include <vector>

#include "core/ops/view.h"
#include "layers/model_config.h"

namespace loom::parallel::testing {

// The values a placement (core/placement.h) names in the global tensor `full`: along each split
// dim its runs, concatenated in order. Written from the placement alone, so comparing it with
// expected_tp_part checks what the TP layers recorded.
inline Tensor part_at(const Tensor& full, const Placement& p) {
  Tensor t = full;
  for (const PlacementSplit& s : p.splits) {
    std::vector<Tensor> runs;
    for (const PlacementRun& r : s.runs) runs.push_back(ops::narrow(t, s.dim, r.global, r.length));
    t = ops::contiguous(ops::cat(runs, s.dim));
  }
  return t;
}

inline Tensor expected_tp_part(const std::string& name, const Tensor& full, const ModelConfig& c,
                               int r, int n) {
  auto chunk = [&](const Tensor& t, int64_t dim) {
    const int64_t len = t.size(dim) / n;
    return ops::contiguous(ops::narrow(t, dim, r * len, len));
  };
  auto ends = [&](const std::string& s) {
    return name.size() >= s.size() &&
           name.compare(name.size() - s.size(), std::string::npos, s) == 0;
  };
  if (ends("attn.qkv.weight") || ends("attn.qkv.bias")) {  // q, k, v each split by heads
    const int64_t D = c.head_dim(), q = c.n_head * D, kv = c.kv_heads() * D;
    const std::vector<Tensor> segs = ops::split(full, {q, kv, kv}, 0);
    return ops::contiguous(ops::cat({chunk(segs[0], 0), chunk(segs[1], 0), chunk(segs[2], 0)}, 0));
  }
  if (ends("mlp.fc.weight") || ends("mlp.fc.bias") || ends("mlp.gate.weight") ||
      ends("mlp.gate.bias") || ends("mlp.up.weight") || ends("mlp.up.bias") ||
      name == "wte.weight" || name == "lm_head.weight") {
    return chunk(full, 0);  // column-parallel and vocab-parallel: rows
  }
  if (ends("attn.proj.weight") || ends("mlp.proj.weight") || ends("mlp.down.weight")) {
    return chunk(full, 1);  // row-parallel: columns
  }
  return full;  // replicated
}

}  // namespace loom::parallel::testing
