// parallel/odc/odc_gatherer.h — OdcGatherer: ZeRO-3's parameter side with On-Demand
// Communication (ODC, Wan, Qi et al., "Revisiting Parameter Server in LLM Post-Training", ICLR
// 2026, arXiv 2601.19362): the same layout as Zero3Gatherer (parallel/dp/zero3.h; rank r of the
// shard group owns elements [r·n, (r+1)·n) of every unit, so the optimiser pieces, placements
// and checkpoints are ZeRO-3's), but every transfer is one-sided through OneSidedWindows
// (parallel/comm/one_sided.h) and the group synchronises once per step. It owns its windows (its
// base dp::UnitGatherer holds the owned parameter shards and runs the hook schedule); it does not
// own the buckets, the communicators, the MiCS second hop (GradSync) or the optimizer. DataParallel
// builds it at stage 3 when DataParallelConfig::odc.
//
// Note [ODC]: two windows over the shard group (dp, or the MiCS partition), laid out like the
// buckets' owned ranges: unit u's shard sits at element offset o_u = Σ_{v<u} n_v.
//   parameter window (Σ n_u elements): the published copy of this rank's owned shards. A unit is
//     PULLED with one get per owner, in rotated order (rank r starts with owner r + 1, so no
//     owner is read by every rank at once), into the unit's flat parameter buffer: just in time
//     before its forward, the next unit prefetched while it computes, again before its backward
//     (prefetching the previous), released after use — the schedule Zero3Gatherer shares, in
//     their base dp::UnitGatherer (parallel/dp/unit_gatherer.cpp).
//   gradient window: when a unit's last gradient hook fires, its flat gradient is PUSHED, each
//     owner's n-element piece accumulated (one-sided, MPI_SUM) into that owner's window; the
//     window persists across micro-batches, so accumulation costs nothing extra and a rank may
//     run any number of micro-batches (none included) in a step.
// Synchronisation, per step:
//   finish() (DataParallel::finish_gradient_sync, after this rank's last backward): every push
//     completed and flushed, ONE barrier; then each owner turns its window into the averaged
//     gradient shard, bucket.grad_shard = Σ/S (S = shard group size: ZeRO-3's reduce-scatter avg,
//     so the norm and the optimiser see the same numbers), zeroes the window, and with MiCS
//     all-reduces (avg) the shard across the replica group (the same once-per-step second hop as
//     ZeRO-3). Nothing else in the step waits for another rank: no per-unit and no per-micro-batch
//     collective.
//   publish (ONE barrier before the next pulls): after the optimiser's step wrote the owned
//     shards (parameters_changed(), from the sharded optimizer's after-step), each rank copies
//     them into its parameter window and barriers, so no rank pulls a shard before its owner has
//     updated it. Views handed out for writing (DataParallel::owned_pieces: a checkpoint load)
//     mark the shards stale instead, and the next start_step() or acquire() publishes. Had this
//     rank read windows outside a step since the last barrier (validation, full_parameters), one
//     more barrier precedes the copy, so no reader sees it half-written. All of these happen in
//     calls every rank makes (the optimiser step, zero_grad, validation and sampling, which are
//     collective at ZeRO-3 anyway, checkpoints), so every rank barriers at the same points;
//     forwards and backwards inside a step never barrier.
// Determinism (OdcOptions::deterministic): without it all origins accumulate into one buffer per
//   owner, so the f32 sum's order is the arrival order — bit-reproducible only with at most two
//   additions per location and step (two ranks, one micro-batch each: addition commutes but
//   does not associate). With it the gradient window has S slots: origin o accumulates
//   only into slot o (its own micro-batches, in its issue order: MPI orders one origin's
//   accumulates to one location), and finish() adds the slots in rank order and divides once,
//   the arithmetic of MpiCommunicator's rank-order reduce-scatter (Note [Deterministic
//   reductions]). Runs are then bitwise reproducible, and one micro-batch per rank gives ZeRO-3's
//   bits exactly. Memory: the gradient window holds S·Σn_u ≈ Ψ elements per rank (an unsharded
//   gradient) instead of Ψ/S, which gives back ZeRO-3's gradient saving; hence the default is off
//   (parallel.odc_deterministic: false), for memory, and the mode is for debugging and
//   reproducibility studies.
// On CUDA tensors the windows are CUDA IPC ones (one node; compiled, never run) and the
// deterministic layout is always used (Note [ODC over CUDA IPC] in
// parallel/comm/cuda_ipc_window.cpp). Memory in all: parameter window Ψ/S, gradient window Ψ/S
// (deterministic: Ψ), besides ZeRO-3's own shards (the owned parameter shard, kept apart from the
// published copy so that the optimiser can write it while nobody reads it; grad_shard; optimiser
// state).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/one_sided.h"
#include "parallel/dp/dp_stats.h"
#include "parallel/dp/grad_buckets.h"
#include "parallel/dp/grad_sync.h"
#include "parallel/dp/unit_gatherer.h"

namespace loom::parallel::odc {

struct OdcOptions {
  bool deterministic = false;  // per-origin slots added in rank order (Note [ODC])
  bool overlap = true;         // push from the hooks; false: keep unit gradients until finish()
  double timeout_s = 300;      // a transfer slower than this throws, naming window and owner
};

class OdcGatherer final : public dp::UnitGatherer {
 public:
  // Creates the windows (collective over `shard`, which must have nothing in flight), takes each
  // unit's owned shard out of the buckets' parameter buffers and releases the buffers, and
  // publishes the shards. sync: its second hop only (MiCS's replica all-reduce). All must
  // outlive this object.
  OdcGatherer(dp::GradBuckets& buckets, Communicator& shard, dp::GradSync& sync, DpStepLog& log,
              const OdcOptions& options);
  // As above with windows of the caller's making (tests, another backend): `params` of Σ n_u
  // elements and `grads` of Σ n_u, or S·Σ n_u when deterministic, over the shard group.
  OdcGatherer(dp::GradBuckets& buckets, std::unique_ptr<OneSidedWindow> params,
              std::unique_ptr<OneSidedWindow> grads, dp::GradSync& sync, DpStepLog& log,
              const OdcOptions& options);
  ~OdcGatherer() override;

  void start_step() override;
  void finish() override;
  void parameters_changed() override { publish(); }
  void parameters_may_change() override { stale_ = true; }
  int64_t window_bytes() const override;
  std::string describe() const override;

  // Unit u's element offset in every rank's windows (o_u in Note [ODC]).
  int64_t window_offset(int unit) const { return offsets_.at(static_cast<size_t>(unit)); }

 private:
  struct PendingPush {  // a unit gradient's accumulates in flight
    WorkPtr work;
    Tensor grad_flat;  // kept alive until every accumulate has read it
  };

  // dp::UnitGatherer: pulls in rotated owner order; reap finished pushes; push; publish stale
  // shards before an acquire (which is collective: DataParallel::full_parameters).
  WorkPtr fetch(int unit, const Tensor& flat) override;
  std::string fetch_op() const override { return "odc get " + params_->name(); }
  void backward_begins() override { reap_pushes(false); }
  void send_gradient(int unit, DpEventKind kind, bool sync) override;
  void before_acquire() override {
    if (stale_) publish();
  }

  void init();
  void publish();
  void reap_pushes(bool wait_all);

  std::unique_ptr<OneSidedWindow> params_, grads_;
  dp::GradSync& sync_;
  OdcOptions options_;
  std::vector<int64_t> offsets_;
  int64_t total_ = 0;  // Σ n_u: one slot of the gradient window
  std::vector<PendingPush> pushes_;
  bool stale_ = true;                // the owned shards changed since they were last published
  bool outside_reads_ = false;       // windows read outside a step since the last barrier
  bool in_step_ = false;             // between start_step() and finish()
  bool unpublished_finish_ = false;  // finish() zeroed the gradient window; no barrier since
};

// The windows OdcGatherer needs over `shard` for these buckets (MPI RMA:
// Communicator::one_sided_window).
int64_t odc_slot_numel(const dp::GradBuckets& buckets);

// ODC as DataParallel's stage-3 gatherer (DataParallelConfig::gatherer): OdcGatherers with
// these options, their overlap DataParallel's.
dp::GathererFactory gatherer_factory(const OdcOptions& options);

}  // namespace loom::parallel::odc
