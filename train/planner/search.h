// train/planner/search.h — the layouts of a model on a number of GPUs that fit in their memory
// (`train --plan --search --gpus N --device NAME`): every data/tensor/pipeline/context split of
// the GPUs, with ZeRO stages, sequence parallelism and activation checkpointing, each validated
// as a config (a refused one keeps the config error as its reason) and planned (train/planner/
// memory.h) against the device (train/planner/devices.h).
//
// Without a step-time prediction the layouts that fit are listed by how little they split the
// model (least tp·pp·cp, then least ZeRO, checkpointing last) — a guess at speed, said as such.
// rank_by_step_time() orders them by the step-time model's tokens/s (train/planner/
// step_time.h) on the calibrated device and links (`train --plan --search … --time`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/planner/calibrate.h"
#include "train/planner/devices.h"
#include "train/planner/step_time.h"

namespace loom::planner {

struct LayoutCandidate {
  std::string layout;      // "dp 4 × tp 2, ZeRO-1, sp, checkpointing"
  Config config;           // the base config with this layout
  int64_t peak_bytes = 0;  // the largest rank's step peak (0 when refused)
  bool fits = false;
  std::string reason;     // why not: the config error, or the memory it lacks
  std::string overrides;  // the layout as `--set` options on the base config
  // rank_by_step_time(): the predicted step and tokens/s (0: not predicted; `reason` says why)
  double step_s = 0, tokens_per_s = 0;
};

// Every layout of `gpus` ranks for the config's model and global batch (its parallel.* replaced;
// micro-batches of data.batch_size sequences, accumulated — or pipelined — as many times as the
// data-parallel degree leaves), in the order above: those that fit first.
std::vector<LayoutCandidate> search_layouts(const Config& base, int64_t gpus,
                                            const DeviceSpec& device);

// Predicts every fitting candidate's step (train/planner/step_time.h) and orders them by
// tokens/s, fastest first; those the model does not cover follow, with the reason.
void rank_by_step_time(std::vector<LayoutCandidate>& candidates, Calibration& cal,
                       const ClusterLinks& links);

// The table `train --plan --search` prints.
std::string format_search(const std::vector<LayoutCandidate>& candidates, int64_t gpus,
                          const DeviceSpec& device);

}  // namespace loom::planner
