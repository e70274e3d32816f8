// train/planner/sdp_worker.cpp — an SDP worker's subnetwork from the engine's covers (see the
// header).
#include "train/planner/sdp_worker.h"

#include "parallel/sdp/options.h"

namespace loom::planner {

SdpWorker sdp_worker(const Config& c, int dp_rank) {
  const parallel::sdp::SdpOptions& o = c.parallel.sdp;
  SdpWorker w;
  if (!o.on()) return w;
  w.on = true;
  const int64_t n = parallel::sdp::workers_of(o, c.parallel.dp);
  const int worker = static_cast<int>(dp_rank % n);
  if (o.blocks()) {
    const parallel::sdp::BlockAssignment cover =
        parallel::sdp::block_cover(o, c.model, c.parallel.dp);
    w.workers = cover.workers;
    w.replication = cover.replication;
    w.blocks = cover.owned_blocks(worker);
    w.branch_scale = static_cast<double>(cover.workers) / cover.replication;
  } else {
    const parallel::sdp::NeuronAssignment cover =
        parallel::sdp::neuron_cover(o, c.model, c.parallel.dp);
    w.workers = cover.workers;
    w.replication = cover.replication;
    for (const parallel::sdp::LayerCover& l : cover.layers) w.ffn.push_back(l.owned_count(worker));
    w.scaled_mlp_out = cover.replication != cover.workers;
  }
  return w;
}

}  // namespace loom::planner
