// train/planner/zero3.h — ZeRO-3's parameter units on the byte counter (Note [Memory timeline]
// in train/planner/memory.h): the unit gatherer's gathers, releases, gradient buffers and
// reductions in flight, told by the replay where the model brackets each unit (UnitEvents,
// train/planner/replay.h).
//
// Note [ZeRO-3 memory]: it mirrors parallel/dp/unit_gatherer.cpp and parallel/dp/zero3.cpp. A
// unit's flat parameter buffer (its padded size) is materialised when it is gathered and
// released when its last forward use ends or its gradients are ready; an outermost forward use
// of unit u prefetches u + 1, a backward of u prefetches u − 1; a backward attaches the unit's
// flat gradient buffer (its padded size), which the reduce-scatter takes once the unit's
// gradients are ready and keeps until the reduction is reaped (at the next unit's backward or
// gradient send, or the step's end), with a shard-sized partial for every micro-batch after the
// first. When a reduction completes is timing: the lower bound reaps it at the next reap point
// (it completed at once), the upper holds each until one more unit's gradients have been sent.
// ODC (parallel/odc/odc_gatherer.h) has the same schedule with one-sided pulls and pushes: a
// push accumulates into the owner's gradient window, so there is no partial; its windows are
// MPI's memory, outside Loom's allocator (the plan lists them apart).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "train/planner/replay.h"

namespace loom::planner {

class Zero3Units final : public UnitEvents {
 public:
  // units: each unit's padded elements; shard: its shard's (padded / shards); e: bytes each.
  Zero3Units(ByteTimeline& tl, std::vector<int64_t> units, int64_t shards, int64_t e,
             bool late_reductions, bool partials = true);

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void gradients_ready(int unit) override;
  // The step's end (Zero3Gatherer::finish): everything released, every reduction reaped; the
  // next step writes the shards afresh.
  void finish();

 private:
  struct Reduce {
    ByteTimeline::Id grad = 0, partial = 0;
    int sent_after = 0;  // units sent since (the upper bound's clock)
  };
  void gather(int unit);
  void release(int unit);
  void reap(bool all);
  int64_t bytes(int unit) const { return units_.at(static_cast<size_t>(unit)) * e_; }

  ByteTimeline& tl_;
  std::vector<int64_t> units_;
  int64_t shards_, e_;
  bool late_, partials_;
  std::vector<ByteTimeline::Id> gathered_, grad_;
  std::vector<int> uses_;
  std::vector<bool> shard_written_;
  std::vector<Reduce> reduces_;
};

// A pipeline stage's units (Note [Sharded stages] in parallel/pp/pipeline.h): the model's unit u
// maps to the stage's buckets of[u] (the first rank's embeddings split into the table and the
// rest; the last rank's tied copy under unit 0), as parallel::pp::StageUnitHooks maps them.
class StageUnitEvents final : public UnitEvents {
 public:
  StageUnitEvents(UnitEvents& inner, std::vector<std::vector<int>> of)
      : inner_(inner), of_(std::move(of)) {}
  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void gradients_ready(int unit) override;

 private:
  const std::vector<int>& of(int unit) const { return of_.at(static_cast<size_t>(unit)); }
  UnitEvents& inner_;
  std::vector<std::vector<int>> of_;
};

}  // namespace loom::planner
