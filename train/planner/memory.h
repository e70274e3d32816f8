// train/planner/memory.h — the memory a layout needs on each rank, predicted from the config
// alone (no model is built, nothing is allocated): parameters, gradients, optimizer state,
// gradient buckets, activations at the schedule's peak and the step's transient buffers, and
// their total, each line with the formula behind it (docs/planning.md).
//
// Note [Memory timeline]: the activation and transient figures are not a closed form guessed
// from the layers: they come from replaying, on a byte counter, the allocations and frees the
// step really makes — each op's outputs, the tensors its backward node saves and frees when it
// has run (core/autograd.cpp releases a node after it runs), the gradients the autograd engine
// sums where a tensor has two consumers, the fused kernels' scratch — in the order the step
// runs them: the micro-batches of the plain runner, or the pipeline schedule's instruction list
// (parallel/pp/schedule.h). The replay mirrors layers/block.cpp, layers/attention.cpp,
// layers/mlp.cpp, layers/transformer.cpp and the op front-ends in core/ops/; a change to what
// an op saves must change the replay too (tests/train/plan_memory_mpi_test.cpp fails
// otherwise: it compares the prediction with the allocator's measured peak on every rank).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

namespace loom::planner {

// Where a rank sits in the mesh (its coordinate on each axis).
struct RankCoord {
  int64_t dp = 0, pp = 0, cp = 0, tp = 0;
};

struct MemoryLine {
  std::string what;     // "parameters", "gradients", …
  int64_t bytes = 0;    // on this rank
  std::string formula;  // how it is computed, in the terms of docs/planning.md
};

struct MemoryPlan {
  RankCoord rank;
  std::vector<MemoryLine> lines;  // what is held between steps, then the step's peak parts
  int64_t persistent_bytes = 0;   // held between steps (parameters, state, buffers)
  int64_t peak_bytes = 0;         // the predicted peak of the allocator during a step
  // The peak if every transfer completed as soon as it is issued; below peak_bytes only where
  // that is timing (a pipeline's sends, Note [Pipeline memory] in train/planner/pipeline.h).
  int64_t peak_low_bytes = 0;
  std::string peak_at;  // where in the step the peak falls ("backward of block 3, mb 0")
};

// The predicted memory of `rank` for the config's layout (parallel.* with dp·pp·cp·tp ranks).
// Throws ConfigError naming the key for what it cannot predict yet.
MemoryPlan plan_memory(const Config& cfg, const RankCoord& rank);

// Every rank's plan, in world-rank order (Loom's mesh order: tp fastest, then cp, then dp, then
// pp — parallel/mesh.h).
std::vector<MemoryPlan> plan_memory_all(const Config& cfg);

// A printable table of one rank's plan ("parameters  12.3 MiB  4·Ψ_r …").
std::string format_memory_plan(const MemoryPlan& plan);

}  // namespace loom::planner
