// train/planner/links.h — measures the links of the cluster a job runs on, for the step-time
// model (Note [Step-time model] in train/planner/step_time.h): `train --calibrate-links` under
// mpirun times each collective the engine uses (all-reduce, all-gather, reduce-scatter, a send,
// and ODC's one-sided pulls and pushes of a unit through an MPI window; not on GPUs, whose ODC
// windows are CUDA IPC ones) at two buffer sizes over the world and fits t = α + n/β to each. Run
// with every rank on one host it measures the link class "intra" (shared memory); with one rank per
// host, "inter" (the hosts' network). The result goes into the calibration file beside the devices'
// measurements. It also measures how much slower a rank computes when every rank of the job
// computes at once than alone (ranks sharing a CPU's memory bandwidth and caches; 1 for GPUs of
// their own): the config's one-block model, timed on rank 0 alone and then on every rank together,
// stored as
// "<class>/slowdown/<ranks>" and applied by the step-time model to layouts of that many ranks
// placed the same way.
//
// Note [Overlap cost]: a collective the engine runs behind compute (data-parallel buckets during
// backward, ZeRO-3's prefetched gathers, the cp ring's hops) is free only where the device has
// something else to run it with: a GPU's copy engines and NVLink, not a CPU whose cores all
// compute (the reduction's copies and sums then take a core's time from the compute). The
// calibration measures the fraction κ: the one-block model timed on every rank together, then
// again while every rank's communicator thread runs all-reduces of 8 MiB through all of its
// timed passes (issued after the warm-up; issued before it, as a first version did, they ended
// during it and the median of the timed passes saw none: κ = 0.001–0.01 where it is 0.17–0.18
// on the same 2-core machine); κ = the compute's extra time ÷ the pass's, in [0, 1], stored as
// "<class>/overlap_cost/<ranks>". The step-time model adds κ × the hidden part of every
// overlapped collective (0 where not measured: GPUs with data-sheet links).
//
// Note [Idle and busy links]: a link's rate can depend on what ran on it just before. Over the
// 2-host test bed (TCP through tbf at 100 Mbit/s each way, a 200 ms queue), a 26 MB all-gather
// or all-to-all between two hosts took 1.10 s when issued after a barrier (23.6 MB/s: both
// directions at the line rate) and 1.9–2.0 s on average when issued back to back (13.5 MB/s;
// single calls 1.1 to 2.3 s): a call issued while the previous one's data is still queued runs
// with both directions' queues full. Each collective is therefore timed both ways at the large
// size — back to back ("bandwidth", with the small size's latency) and each call after a barrier
// ("idle_bandwidth") — and the step-time model prices a collective at the idle rate where the
// engine issues it onto a link its compute left idle (ZeRO-3's and ODC's gathers of a unit that
// the previous unit's compute hides; the tables' gathers), at the busy rate where it queues
// behind another (buckets, reduce-scatters after a backward's gather). Within a host the two
// agree to a few per cent.
#pragma once

#include <string>

#include "parallel/parallel_context.h"
#include "train/planner/calibrate.h"

namespace loom::planner {

// Collective: every rank of ctx.world() calls it. Stores the class's "latency", "bandwidth" and
// "idle_bandwidth" in `cal` (rank 0 saves it) and returns a line for the log ("inter: α 41.2 µs,
// β 19.8 MB/s").
std::string calibrate_links(const parallel::ParallelContext& ctx, const Config& cfg,
                            Calibration& cal);

}  // namespace loom::planner
