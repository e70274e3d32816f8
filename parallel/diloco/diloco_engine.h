// parallel/diloco/diloco_engine.h — DilocoEngine: DiLoCo and Streaming DiLoCo as a gradient
// engine (parallel/engine.h) wrapping the island's own engine, whatever layout that trains
// (dp, ZeRO, MiCS, ODC, tp, pp, cp): the inner steps are the wrapped engine's, unchanged; every
// H steps each fragment's outer step is taken across the islands (Note [DiLoCo]).
//
// Note [DiLoCo]: islands are separate launches (each its own mpirun or Slurm step) that train
// the same model on their own shares of the data. Each keeps the outer weights θ of its lanes'
// ranges (Note [Lanes] in parallel/diloco/island_lanes.h) in host memory. When fragment f's
// sync comes (parallel.diloco.inner_steps H, fragments P: fragment f at steps f·H/P + k·H), the
// island gathers its inner weights φ to the lanes, each lane computes the pseudo-gradient
// Δ = θ − φ and the islands of the round's quorum (Note [Quorum] in
// parallel/diloco/island_link.h) average it over Gloo — as f32, or quantised to int8/int4 with
// error feedback (parallel/diloco/quantize.h), then all-gathered and summed in island order so
// every island gets the same bits. If the round commits, each island takes the outer step
// (parallel/diloco/outer_optimizer.h: Nesterov SGD, lr 0.7, momentum 0.9 by default) and
// writes θ back into every rank's pieces: φ ← α·φ + (1 − α)·θ (α: fragment_alpha, 0 by
// default). With overlap_steps τ > 0 the exchange runs on a background thread while τ more
// inner steps run, and the write-back happens after them (Streaming DiLoCo). A round that
// aborts (an island died or timed out) changes nothing: the inner weights go on, and the next
// sync's Δ covers both intervals. An island that restarts, or was left out of a round, joins
// the next one: it sends zeros, receives the source island's outer state after the step, sets
// its inner weights to it, restarts its inner optimizer's state (the inner layouts may differ,
// so the moments are not copied) and — when it is a new process — the run's step and data
// position (Note [Joining running peers] in parallel/engine.h). Data: island i reads the data
// as replicas i·D..(i+1)·D − 1 of islands·D (D: its own data-parallel replicas), so while an
// island is away its share of the data is not read, and a rejoining island resumes at the
// others' position; the learning-rate schedule follows the step, which every island shares.
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <thread>

#include "parallel/diloco/island_lanes.h"
#include "parallel/diloco/island_link.h"
#include "parallel/diloco/options.h"
#include "parallel/diloco/outer_optimizer.h"
#include "parallel/diloco/quantize.h"
#include "parallel/engine.h"

namespace loom::parallel::diloco {

struct DilocoParts {
  DilocoOptions options;
  std::unique_ptr<GradientEngine> inner;  // the island's engine, already built
  Communicator* world = nullptr;          // the island's ranks (null: one)
  const ParallelContext* ctx = nullptr;   // the island's context (null: one rank)
  FragmentsOf fragments_of;               // Note [Fragments] in parallel/diloco/options.h
  double op_timeout_s = 300;              // parallel.comm_timeout_s: an exchange's deadline
  int64_t total_steps = 0;      // train.steps: no sync whose write-back would fall after it
  std::ostream* log = nullptr;  // one line per round (rank 0's log)
};

class DilocoEngine final : public GradientEngine {
 public:
  explicit DilocoEngine(DilocoParts parts);
  ~DilocoEngine() override;

  void zero_grad() override { inner_->zero_grad(); }
  void begin_micro_batch(int64_t m, int64_t count) override { inner_->begin_micro_batch(m, count); }
  Tensor finish() override { return inner_->finish(); }
  void step(double lr, const Tensor& factor) override;
  std::vector<HeldPiece> trained_pieces() const override { return inner_->trained_pieces(); }
  std::vector<HeldPiece> held_parameters() const override { return inner_->held_parameters(); }
  NamedTensors optimizer_state() override { return inner_->optimizer_state(); }
  int64_t optimizer_steps() const override { return inner_->optimizer_steps(); }
  void set_optimizer_steps(int64_t n) override { inner_->set_optimizer_steps(n); }
  std::optional<NamedTensors> whole_parameters() override { return inner_->whole_parameters(); }
  bool collective_forward() const override { return inner_->collective_forward(); }
  bool equal_micro_batches() const override { return inner_->equal_micro_batches(); }
  double evaluation_loss(double local) override { return inner_->evaluation_loss(local); }
  const DpStepStats* sync_stats() const override { return inner_->sync_stats(); }
  std::optional<RunPosition> start(const RunPosition& here,
                                   std::function<RunPosition()> now) override;
  std::vector<HeldPiece> engine_state() override;
  std::map<std::string, std::string> engine_counters() const override;
  void restore_state(const std::map<std::string, std::string>& counters) override;
  std::string describe() const override;
  std::string describe_end() override;

  // Totals so far: rounds taken part in, committed, bytes this rank sent to other islands.
  struct Totals {
    int64_t rounds = 0, commits = 0, aborts = 0, bytes_sent = 0, peak_round_bytes = 0;
  };
  const Totals& totals() const { return totals_; }

 protected:
  void sync() override {}  // finish() forwards to the inner engine
  std::vector<HeldPiece> gradients() override { return {}; }

 private:
  struct Round;  // a round in flight (diloco_engine.cpp)
  void launch(int64_t f, int64_t step);
  void run_round(Round& r);  // on the lanes: quorum, exchange, vote, outer step
  void exchange(Round& r);
  void conclude(Round& r);  // on every rank, at the write-back step
  bool receive_state(Round& r, RunPosition* position);
  size_t state_bytes() const;
  std::vector<uint8_t> pack_state(const RunPosition& at) const;
  RunPosition unpack_state(const std::vector<uint8_t>& blob);
  void reset_inner_optimizer();
  Member me() const;
  std::vector<HeldPiece> counted_pieces() const;  // each element once over the island
  std::string line(const Round& r) const;

  DilocoOptions o_;
  std::unique_ptr<GradientEngine> inner_;
  Communicator* world_;
  const ParallelContext* ctx_;
  double op_timeout_s_;
  int64_t total_steps_;
  std::ostream* log_;
  std::unique_ptr<IslandLanes> lanes_;
  std::unique_ptr<IslandLink> link_;   // lanes only
  std::vector<OuterOptimizer> outer_;  // per fragment, this lane's range
  std::vector<ErrorFeedback> feedback_;
  std::vector<Tensor> staged_;  // engine_state()'s values, read back by restore_state
  std::function<RunPosition()> now_;
  int64_t step_ = 0;                // inner steps done
  int64_t commits_ = 0;             // committed rounds in this island's outer state
  bool met_ = false;                // in a quorum before (the first round waits for every island)
  bool left_out_ = false;           // not let into the last round: takes the state in the next
  bool restored_ = false;           // outer state from a checkpoint
  std::unique_ptr<Round> pending_;  // τ > 0: the round whose write-back is due
  Totals totals_;
};

}  // namespace loom::parallel::diloco
