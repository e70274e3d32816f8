// train/planner/step_time.h — the predicted time of one training step of a layout, composed from
// measured parts (Note [Step-time model]): the compute of each rank from the calibration
// (train/planner/calibrate.h), the communication of each group from the measured links of the
// cluster (LinkModel), the pipeline's bubble from the schedule simulator (parallel/pp/simulate.h)
// and the overlap the data-parallel engine gets from its gradient buckets.
//
// Note [Step-time model]: for the slowest rank (every pipeline stage is priced; the step is the
// pipeline's makespan, so the slowest stage sets it), per step:
//   compute  = m · (L_r · block + rest_r) + optimizer(Ψ_r)
//     m micro-batches; L_r blocks on the rank; block and rest measured at the rank's micro-batch
//     (B rows of T/cp tokens) and corrected to the rank's shapes (Note [Compute calibration]);
//     Ψ_r the parameters the rank updates (÷ tp, its pp stage's, ÷ dp·cp under ZeRO ≥ 1).
//   tp, cp   = every collective of the layer paths, on the critical path (the compute waits on
//     each): tp forward 2 all-reduces (or with sequence parallelism 2 all-gathers + 2
//     reduce-scatters) of B·T/cp·C elements per block and micro-batch, backward their transposes
//     (parallel/tp/comm_ops.h: the same bytes), and with checkpointing the recomputed forward's
//     again (the vocabulary-parallel loss's small reductions are not priced); cp: the ring's
//     cp − 1 K,V hops forward and backward per block and micro-batch, each pass less the ring
//     attention's compute it overlaps, plus the cp hops of the gradient accumulators backward
//     (waited for at once), and the recomputed forward's again.
//   dp       = over the dp·cp group (context-parallel ranks reduce gradients like data-parallel
//     ones): the gradient buckets (parallel.bucket_mb) reduced in the order backward fills them,
//     each starting when its last gradient is ready and the previous one is done: only what runs
//     past the end of backward is exposed (parallel.overlap false: all of it), and a
//     context-parallel ring's hops wait behind them (Note [Buckets on the link] in
//     train/planner/dp_backward.h, with the tables' early buckets and sparse rows); ZeRO-1/2 add
//     the all-gather of the updated parameter shards; ZeRO-3 gathers each unit's parameters before
//     its forward and backward (prefetched one unit ahead: exposed where a gather is longer than
//     the unit's compute) and reduce-scatters its gradients as backward goes. With MiCS
//     (parallel.mics_partition_size P) ZeRO shards, gathers and reduce-scatters within the
//     partitions of P consecutive dp·cp ranks, and ZeRO-2/3 add the all-reduce of the gradient
//     shards across the dp·cp/P replicas after backward (parallel/dp/data_parallel.h). ODC
//     (Note [ODC] in parallel/odc/odc_gatherer.h) is ZeRO-3's schedule with one-sided pulls and
//     pushes (kGet, kAccumulate) in place of the gathers and reduce-scatters, and two barriers.
//   pp       = the schedule's makespan from simulate() (parallel/pp/simulate.h) given each
//     global stage's measured forward and backward (its blocks, the rest on the last stage, its
//     collectives) and the measured transfer of one activation (StageCosts), so unbalanced
//     stages are priced as they run; the bubble is the makespan less the slowest rank's work,
//     plus the tied table's exchange between the first and last stage.
//   packed documents (data.packing): the compute is the data's: the run's first steps as the
//     trainer's loader cuts them, each micro-batch priced by its documents (Note [Packed step
//     time] in train/planner/packed_steps.h), the ranks meeting at the step's end or, ZeRO-3
//     with collectives, at every micro-batch; the collectives priced at the mean micro-batch.
//   Ranks sharing one machine's cores and memory compute slower together than alone: the
//     factors `--calibrate-links` measures multiply compute and the optimizer.
// A collective over n bytes (its whole buffer: all-reduce's, all-gather's output,
// reduce-scatter's input; a send's message) costs α + n/β on the group's slowest link, α and β
// measured per collective and link class (`train --calibrate-links`: between ranks of one host,
// and between hosts) over g₀ ranks; over g ranks the ring algorithms' step counts and byte
// factors scale them (all-reduce 2(g−1) steps, factor 2(g−1)/g; reduce-scatter and all-gather
// g−1 steps, factor (g−1)/g; a send 1 step, factor 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/planner/calibrate.h"
#include "train/planner/devices.h"
#include "train/planner/memory.h"

namespace loom::planner {

// The collectives the engines use, as the link calibration measures them; kGet and kAccumulate
// are ODC's one-sided pulls and pushes of a unit (Note [ODC] in parallel/odc/odc_gatherer.h),
// measured and priced like the all-gather and reduce-scatter they replace: a buffer of n bytes
// is a unit, of which a rank pulls (or pushes) the g − 1 pieces other ranks own.
enum class Collective { kAllReduce, kAllGather, kReduceScatter, kSend, kGet, kAccumulate };
constexpr Collective kCollectives[] = {Collective::kAllReduce,     Collective::kAllGather,
                                       Collective::kReduceScatter, Collective::kSend,
                                       Collective::kGet,           Collective::kAccumulate};
const char* collective_name(Collective c);  // "all_reduce", … (the calibration file's keys)

// One collective on one link class: seconds per call and buffer bytes per second, issued behind
// another and issued onto an idle link (Note [Idle and busy links] in train/planner/links.h; 0:
// not measured apart, the same).
struct CollectiveFit {
  double latency_s = 0;
  double bytes_per_s = 0;
  double idle_bytes_per_s = 0;
};

// One link class as measured over `ranks` ranks (`train --calibrate-links`), and how much slower
// those ranks computed and updated all at once than one alone (1 where not measured); or as a
// data sheet describes it (links_from_sheet).
struct LinkModel {
  int64_t ranks = 2;
  std::string source = "measured";  // or "data sheet"
  CollectiveFit fits[6];            // by Collective
  double compute_slowdown = 1, memory_slowdown = 1;
  double overlap_cost = 0;  // Note [Overlap cost] in train/planner/links.h
  CollectiveFit& fit(Collective c) { return fits[static_cast<int>(c)]; }
  const CollectiveFit& fit(Collective c) const { return fits[static_cast<int>(c)]; }
  bool known() const { return fit(Collective::kAllReduce).bytes_per_s > 0; }
};

// Where the ranks are: ranks_per_host consecutive world ranks share a host (0: all on one), and
// the two link classes.
struct ClusterLinks {
  int64_t ranks_per_host = 0;
  LinkModel intra, inter;
};

struct TimeLine {
  std::string what;     // "compute", "tp collectives", …
  double seconds = 0;   // per step, on the slowest rank
  std::string formula;  // how it is computed (docs/planning.md)
};

struct StepTimePlan {
  std::vector<TimeLine> lines;
  double step_s = 0;
  double tokens_per_s = 0;
  int64_t ranks = 1;
  double flops_per_token = 0;  // the model's (Note [Model FLOPs] in layers/transformer.h)
};

// The predicted step time of the config's layout on this process's device (the calibration's)
// and the cluster's links. Throws ConfigError naming the key for what it cannot predict
// (SDP, DiLoCo, and a group whose link was not measured). Packed documents (data.packing): the
// compute of the run's first steps read from its data (Note [Packed step time] in
// train/planner/packed_steps.h).
StepTimePlan plan_step_time(const Config& cfg, Calibration& cal, const ClusterLinks& links);

// A printable table ("compute  812.4 ms  m·(L_r·block + rest_r) + optimizer …"); with `device`,
// also the MFU against its data sheet's dense bf16 rate.
std::string format_step_time(const StepTimePlan& plan, const DeviceSpec* device = nullptr);

// The cluster's links as the calibration file keeps them ("intra/all_reduce/latency", …,
// "intra/slowdown/<ranks>", "intra/memory_slowdown/<ranks>"; train/planner/links.h).
ClusterLinks links_from(const Calibration& cal, int64_t ranks_per_host);

// Note [Data-sheet links]: a GPU cluster's links before anything was measured on it — within a
// host the NVLink rate one way (half the sheet's both-ways figure), between hosts the network
// rate per GPU (one NIC per GPU, as the vendors' 8-GPU systems have), both at the rate a ring
// reaches (bus bandwidth = link rate), and the latency per ring step NCCL's own tuning model
// uses for its ring/Simple protocol (src/graph/tuning.cc: 3.4 µs over NVLink, 14 µs over the
// network). Unchecked (no cluster was measured): the plan says so. ranks_per_host 0: the
// device's GPUs per host.
ClusterLinks links_from_sheet(const DeviceSpec& device, int64_t ranks_per_host);

}  // namespace loom::planner
