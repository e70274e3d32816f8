// train/planner/search.h — the layouts of a model on a number of GPUs that fit in their memory
// (`train --plan --search --gpus N --device NAME`): every data/tensor/pipeline/context split of
// the GPUs, with ZeRO stages, sequence parallelism and activation checkpointing, each validated
// as a config (a refused one keeps the config error as its reason) and planned (train/planner/
// memory.h) against the device (train/planner/devices.h).
//
// Not yet ranked by speed: the step-time model (issue 32's second half) is not built, so the
// layouts that fit are listed by how little they split the model (least tp·pp·cp, then least
// ZeRO, checkpointing last) — a guess at speed, said as such, not a prediction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/planner/devices.h"

namespace loom::planner {

struct LayoutCandidate {
  std::string layout;      // "dp 4 × tp 2, ZeRO-1, sp, checkpointing"
  Config config;           // the base config with this layout
  int64_t peak_bytes = 0;  // the largest rank's step peak (0 when refused)
  bool fits = false;
  std::string reason;  // why not: the config error, or the memory it lacks
};

// Every layout of `gpus` ranks for the config's model and global batch (its parallel.* replaced;
// micro-batches of data.batch_size sequences, accumulated — or pipelined — as many times as the
// data-parallel degree leaves), in the order above: those that fit first.
std::vector<LayoutCandidate> search_layouts(const Config& base, int64_t gpus,
                                            const DeviceSpec& device);

// The table `train --plan --search` prints.
std::string format_search(const std::vector<LayoutCandidate>& candidates, int64_t gpus,
                          const DeviceSpec& device);

}  // namespace loom::planner
