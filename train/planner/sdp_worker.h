// train/planner/sdp_worker.h — an SDP worker's subnetwork as the planner needs it (the memory
// replay, train/planner/memory.h; the step time, train/planner/step_time.h): drawn from the
// engine's own covers (parallel/sdp/options.h), so it is the subnetwork the worker builds.
#pragma once

#include <cstdint>
#include <vector>

#include "train/config.h"

namespace loom::planner {

// Under forward masking (Note [SDP packed MLP] in parallel/sdp/forward_masking.h, Note [SDP
// block masking] in parallel/sdp/block_level.h): the worker's MLP hidden in each block (the
// neuron level's cover), or the blocks it holds (the block level's), and the rescaling.
struct SdpWorker {
  bool on = false;
  int64_t workers = 1, replication = 1;  // N and k
  std::vector<int64_t> ffn;              // per block (neuron level)
  std::vector<int64_t> blocks;           // held, ascending (block level; empty: every block)
  bool scaled_mlp_out = false;           // neuron level, coverage < 1
  double branch_scale = 1.0;             // block level: N/k
};

// The subnetwork of the worker at data-parallel rank `dp_rank` (worker dp_rank mod N); off
// without parallel.sdp.
SdpWorker sdp_worker(const Config& c, int dp_rank);

}  // namespace loom::planner
