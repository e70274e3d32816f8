// parallel/dp/dp_stats.h — what the data-parallel engine reports: the ordered event log of one
// step (gradient hooks and bucket launches on one counter), overlap and exposed-wait figures,
// and per-rank memory with the ZeRO formulas to compare it against. Plain values: nothing here
// communicates or times anything.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loom::parallel {

// Note [Data-parallel event log]: every gradient-ready hook and every collective the engine
// issues appends one event, numbered by a single counter (seq strictly increasing in append
// order). The log is the engine's own account of ordering, so a test can prove overlap without
// timing: "some kLaunch has a smaller seq than the last kHook" means a reduction was issued
// while backward still had gradients to produce; with markers logged from the backward of
// ops between layers (DataParallel::mark), "some kLaunch precedes a kMarker" means a reduction
// was issued while backward still had compute to do.
enum class DpEventKind {
  kHook,           // a parameter's gradient became final (detail: its name)
  kLaunch,         // a bucket's first reduction issued from a hook, during backward
  kLateLaunch,     // issued by finish_gradient_sync (the bucket never completed in backward)
  kReplicaLaunch,  // MiCS second hop (all_reduce across replicas) issued
  kFinishBegin,    // finish_gradient_sync entered (backward is over)
  kFinishEnd,      // every reduction of the step has completed
  kGather,         // ZeRO parameter all_gather issued: after the optimiser step (stages 1, 2),
                   // or when a unit is needed and was not prefetched (stage 3)
  kMarker,         // DataParallel::mark(): the caller's own event (e.g. a backward node ran)
  kEarlyLaunch,    // a parameter's early contribution all-reduced from its partial hook,
                   // during backward (Note [Early contributions and sparse rows])
  kDeferred,       // a bucket left to finish_gradient_sync for a sparse-rows reduction
  kSparseRows,     // that reduction (detail: the parameter, rows sent of rows)
  // Stage 3 (Note [ZeRO-3] in parallel/dp/data_parallel.h); `bucket` is the unit.
  kPrefetch,        // a unit's all_gather issued ahead of its use (next unit in compute order)
  kRelease,         // a unit's gathered parameters freed
  kUnitForward,     // a unit's forward begins (its parameters are gathered)
  kUnitForwardEnd,  // a unit's forward has produced its output
  kUnitBackward,    // a unit's backward begins (its parameters are gathered)
};
const char* dp_event_kind_name(DpEventKind kind);

struct DpEvent {
  uint64_t seq = 0;
  DpEventKind kind = DpEventKind::kHook;
  int bucket = -1;     // -1 when not about a bucket
  std::string detail;  // parameter name, or the collective ("all_reduce", "reduce_scatter", …)
};

// One optimiser step's gradient synchronisation (from the end of the previous sync to the end
// of this one, so accumulation micro-batches are included).
struct DpStepStats {
  int64_t grad_bytes = 0;            // Σ parameter gradient bytes (padding excluded)
  int64_t launched_early_bytes = 0;  // of those, in buckets launched before finish_gradient_sync
  double exposed_wait_s = 0.0;       // time spent in finish_gradient_sync waiting for the network
  // Every wait of the compute thread on communication in the step: ZeRO-3's / ODC's parameter
  // gathers and pulls, plus exposed_wait_s. Under imbalance it includes waiting for slower ranks
  // (host time: NCCL waits that only order streams count ~0).
  double blocked_s = 0.0;
  std::vector<DpEvent> events;

  double overlap_fraction() const {
    return grad_bytes > 0 ? static_cast<double>(launched_early_bytes) / grad_bytes : 0.0;
  }
  // seq of the first event of `kind` (UINT64_MAX when none) / of the last (0 when none).
  uint64_t first_seq(DpEventKind kind) const;
  uint64_t last_seq(DpEventKind kind) const;
  int count(DpEventKind kind) const;
};

// The step being recorded: one counter for every part of the engine (the buckets' hooks, the
// sync's launches, ZeRO-3's gathers), so their events interleave in true order. close() ends a
// step: its record becomes last() and the next one starts empty.
class DpStepLog {
 public:
  void log(DpEventKind kind, int bucket, std::string detail) {
    current_.events.push_back({next_seq_++, kind, bucket, std::move(detail)});
  }
  void add_launched_early(int64_t bytes) { current_.launched_early_bytes += bytes; }
  void add_blocked(double seconds) { current_.blocked_s += seconds; }
  void close(int64_t grad_bytes, double exposed_wait_s) {
    current_.grad_bytes = grad_bytes;
    current_.exposed_wait_s = exposed_wait_s;
    current_.blocked_s += exposed_wait_s;
    last_ = std::move(current_);
    current_ = DpStepStats{};
  }
  const DpStepStats& last() const { return last_; }

 private:
  uint64_t next_seq_ = 0;
  DpStepStats current_, last_;
};

// Bytes this rank holds, read from the engine's buffers.
struct DpMemory {
  int64_t param_bytes = 0;            // parameters kept between steps (full at stages 0–2)
  int64_t grad_bytes = 0;             // gradient memory kept between steps (stages 2, 3: shards)
  int64_t transient_grad_bytes = 0;   // stage 2: full buckets, alive from zero_grad to the sync;
                                      // stage 3: most full unit gradient bytes alive at once
  int64_t transient_param_bytes = 0;  // stage 3: most gathered unit bytes alive at once
  int64_t optimizer_bytes = 0;        // AdamW exp_avg + exp_avg_sq of the owned shard
  int64_t total() const { return param_bytes + grad_bytes + optimizer_bytes; }
};

// Note [ZeRO memory formulas]: with Ψ parameters of e bytes each and N ranks sharing the
// optimiser state (N = dp size, or the MiCS partition size), AdamW with f32 master weights
// (e = 4) needs per rank
//   stage 0:  params eΨ  + grads eΨ   + Adam 2eΨ      (16Ψ bytes for f32)
//   stage 1:  params eΨ  + grads eΨ   + Adam 2eΨ/N
//   stage 2:  params eΨ  + grads eΨ/N + Adam 2eΨ/N
//   stage 3:  params eΨ/N + grads eΨ/N + Adam 2eΨ/N   (+ the gathered units, transiently)
// (the ZeRO paper's 2Ψ + 2Ψ + 12Ψ is the bf16-params / f32-master variant of the same split).
// Another inner optimizer keeps s state tensors per parameter instead of Adam's 2 (SGD with
// momentum 1, without 0): its state is s·eΨ, or s·eΨ/N from stage 1.
// The measured figures exceed these only by bucket padding (< N·16 elements per bucket).
// Stage 3's transient figures are measured, not formulas: about two units' parameters (the
// one in use and the prefetched one, plus a tied embedding) and a few units' gradients.
DpMemory zero_memory_formula(int64_t psi, size_t elem_bytes, int zero_stage, int shard_count,
                             int optimizer_states = 2);

// "params 1.2 MiB, grads 1.2 MiB, optimizer 0.6 MiB (formula: …)" for printing at start.
std::string format_memory(const DpMemory& measured, const DpMemory& formula);

}  // namespace loom::parallel
