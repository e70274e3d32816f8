// parallel/engine.h — GradientEngine: the seam every data-parallel-like scheme plugs into. An
// engine owns how this rank's gradients become final and how its parameters are updated: the
// optimizer alone (LocalEngine, parallel/local_engine.h), data parallelism with DDP, ZeRO 1-3,
// MiCS or ODC (parallel/dp/data_parallel.h), SDP (parallel/sdp/sdp_engine.h). The trainer calls
// only this interface (train/plan.h: TrainPlan = model + step runner + engine); it never asks
// which scheme runs. Contract per optimizer step of M micro-batches (Note [Engine step]):
//   engine.zero_grad();
//   for m in 0..M-1: engine.begin_micro_batch(m, M); forward; backward;   (the step runner)
//   sq = engine.finish();       // gradients final (synced, exchanged); the global Σ g²
//   engine.step(lr, factor);    // every gradient × factor (clipping, loss scaling)
// What it trains and holds is described by pieces with placements (core/tensor_piece.h), so the
// checkpoint writer and the global norm (parallel/gradients.h) cover every scheme unchanged.
//
// Note [Engine step]: finish() is the one place a step's gradients become final: the scheme's
// sync (waiting for what backward launched), then the exchange the plan injected (the pipeline's
// tied embedding, Note [Tied embeddings across stages] in parallel/pp/partition.h) over the
// gradients the optimizer will read, then the global Σ g² of those same gradients from their
// placements (Note [Global Σ g²] in parallel/gradients.h), left on the device. A scheme that
// needs the last micro-batch to arm its sync learns it from begin_micro_batch, which the step
// runner calls for every micro-batch (the pipeline's schedule calls it as each backward starts,
// with m = count − 1 for the step's last one).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/tensor_piece.h"
#include "parallel/dp/dp_stats.h"

namespace loom::parallel {

class ParallelContext;

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Where a run is: its steps done and its data position (LoaderState's, data/loader.h).
struct RunPosition {
  int64_t step = 0;
  int64_t data_epoch = 0, data_position = 0;
};

// Between the sync and the norm: gets the gradients the optimizer will read (Note [Engine step]).
using GradientExchange = std::function<void(const std::vector<HeldPiece>& gradients)>;

class GradientEngine {
 public:
  virtual ~GradientEngine() = default;

  // Before a step's first backward: gradients zeroed (or pointed at the scheme's buffers).
  virtual void zero_grad() = 0;
  // Before micro-batch m of `count` (the runner's; Note [Engine step]); m = -1: a backward that
  // is not the step's last, of a micro-batch the pipeline's schedule does not number.
  virtual void begin_micro_batch(int64_t m, int64_t count) {
    (void)m;
    (void)count;
  }
  // Σ g² over every gradient element this rank holds now, before any reduction: a 0-d f64
  // tensor on the device, or undefined where the engine cannot tell (ZeRO-2/3 and the others
  // reduce as backward runs). Called after an accumulation micro-batch's backward, for the
  // gradient noise scale (Note [Gradient noise scale] in train/noise_scale.h).
  virtual Tensor local_grad_sum_squares() { return Tensor(); }
  // The same without accumulation: with `on`, before the step's (only) backward, the engine sums
  // this rank's Σ g² of each gradient as it hands it to its reduction, which
  // local_grad_sum_squares() returns once the step's reductions are issued (finish() has run).
  // Returns false where the engine cannot (it shards gradients first, or has no reduction).
  virtual bool probe_unreduced_grads(bool on) {
    (void)on;
    return false;
  }
  // Note [Engine step]: the global Σ g² as a 0-d f64 tensor on the device, the same on every
  // rank. Collective. (Virtual for an engine that wraps another: it forwards.)
  virtual Tensor finish();
  // The optimizer step at lr with every gradient multiplied by `factor` (0-d f64 on the device,
  // undefined: 1; not finite: the step is skipped, Note [Device step] in train/train_step.cpp).
  virtual void step(double lr, const Tensor& factor) = 0;

  // What the optimizer steps on this rank, in its order: its state is "<kind>.<name>" of these.
  // Their placements say whose copy a checkpoint stores (Note [Placement] in core/placement.h).
  virtual std::vector<HeldPiece> trained_pieces() const = 0;
  // What a resume fills on this rank: the parameters' values it holds (whole local parameters,
  // ZeRO-3's owned shards, SDP's frozen copies too).
  virtual std::vector<HeldPiece> held_parameters() const = 0;
  virtual NamedTensors optimizer_state() = 0;
  virtual int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(int64_t n) = 0;
  // Copies of the whole parameters when this rank does not hold them between steps (ZeRO-3: a
  // collective gather); nullopt: the model's own parameters are whole.
  virtual std::optional<NamedTensors> whole_parameters() { return std::nullopt; }
  // Whether a forward gathers parameters from other ranks (ZeRO-3 with collectives: every rank
  // must run as many micro-batches, and sampling is collective).
  virtual bool collective_forward() const { return false; }
  // Whether every rank must run as many micro-batches per step (per-micro-batch collectives).
  virtual bool equal_micro_batches() const { return collective_forward(); }
  // A validation loss of this rank's model as the run reports it: each rank's subnetwork's mean
  // when the ranks train different ones (SDP); this rank's own otherwise. Collective when it
  // reduces.
  virtual double evaluation_loss(double local) { return local; }
  // This step's gradient-sync statistics; null for an engine without a sync.
  virtual const DpStepStats* sync_stats() const { return nullptr; }
  // Note [Joining running peers]: called once before the run's first step with where it starts
  // (`here`: 0, or a checkpoint's step and data position) and how to learn, during step(),
  // where the run is after the step being finished (`now`). An engine whose peers already train
  // (DiLoCo's islands, parallel/diloco/diloco_engine.h) fills this rank's parameters from them,
  // resets the optimizer's state, and returns where the peers are; nullopt: start at `here`.
  // Collective over the world.
  virtual std::optional<RunPosition> start(const RunPosition& here,
                                           std::function<RunPosition()> now) {
    (void)here;
    (void)now;
    return std::nullopt;
  }
  // Note [Engine state]: what a checkpoint keeps beyond the parameters and the optimizer's state
  // (DiLoCo's outer weights and momentum): pieces stored under their names (a resume fills
  // their values, then calls restore_state with the counters saved beside them).
  virtual std::vector<HeldPiece> engine_state() { return {}; }
  virtual std::map<std::string, std::string> engine_counters() const { return {}; }
  virtual void restore_state(const std::map<std::string, std::string>& counters) { (void)counters; }
  virtual std::string describe() const = 0;          // for the start of the log ("" alone)
  virtual std::string describe_end() { return ""; }  // for the end of the run (memory peaks)

  // Set by the plan (Note [Engine step]); the context the norm reduces over (null: one process).
  void set_exchange(GradientExchange exchange) { exchange_ = std::move(exchange); }
  void set_context(const ParallelContext* ctx, Device device) {
    ctx_ = ctx;
    device_ = device;
  }

 protected:
  // The scheme's part of finish(): wait for the sync; the gradients the optimizer reads, with
  // placements (views: the exchange writes them in place).
  virtual void sync() = 0;
  virtual std::vector<HeldPiece> gradients() = 0;
  // Those the exchange gets when they differ from gradients() (data parallelism's whole
  // gradients at stage 1); empty: the same.
  virtual std::vector<HeldPiece> exchange_gradients() { return {}; }

 private:
  GradientExchange exchange_;
  const ParallelContext* ctx_ = nullptr;
  Device device_ = Device::cpu();
};

}  // namespace loom::parallel
