// parallel/dp/zero3.h — Zero3Gatherer: ZeRO-3's parameter side, installed as the model's
// UnitHooks (layers/unit_hooks.h). Between uses a rank keeps only its shard of each unit's
// parameters; the gatherer all-gathers a unit just in time (prefetching the next one in compute
// order), releases it after use, and reduce-scatters the unit's gradient as soon as its last
// hook fires (Note [ZeRO-3] in parallel/dp/data_parallel.h). Buckets are units here: bucket u of
// the GradBuckets is unit u. It owns the owned parameter shards and the reductions in flight;
// it does not own the buckets, the communicators, the sync strategy or the optimizer. It is one
// UnitGatherer (parallel/dp/unit_gatherer.h); ODC's one-sided one is parallel/odc/odc_gatherer.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "layers/unit_hooks.h"
#include "parallel/comm/communicator.h"
#include "parallel/dp/dp_stats.h"
#include "parallel/dp/grad_buckets.h"
#include "parallel/dp/grad_sync.h"
#include "parallel/dp/unit_gatherer.h"

namespace loom::parallel::dp {

class Zero3Gatherer final : public UnitGatherer {
 public:
  // Takes each unit's owned shard out of buckets' parameter buffers and releases the buffers.
  // shard: the group the units are sharded over (dp, or the MiCS partition); sync: the
  // reduce-scatter strategy (and MiCS's second hop). All must outlive this object.
  Zero3Gatherer(GradBuckets& buckets, Communicator& shard, GradSync& sync, DpStepLog& log,
                bool overlap);
  ~Zero3Gatherer() override;
  Zero3Gatherer(const Zero3Gatherer&) = delete;
  Zero3Gatherer& operator=(const Zero3Gatherer&) = delete;

  // UnitHooks: gather unit u (and prefetch u+1); release it and announce its backward.
  void before_forward(int unit) override;
  Tensor after_forward(int unit, const Tensor& out) override;

  // Unit u's last gradient hook of this backward fired: release its parameters and, with
  // overlap, reduce-scatter its gradient now. `sync`: the step's last micro-batch (counts
  // toward the overlap figure).
  void unit_gradients_ready(int unit, bool sync) override;
  // A new step: no reduction may be in flight; the shards are written afresh.
  void start_step() override;
  // The step's end: launches what is left, releases every unit, waits for every reduction
  // (summing the micro-batches' into each unit's grad_shard) and runs MiCS's second hop.
  void finish() override;

  // Unit u's owned parameter values (shard_numel), persistent.
  const Tensor& owned_values(int unit) const override {
    return shards_.at(static_cast<size_t>(unit)).param_shard;
  }
  // Gathers unit u now if it is not (collective over the shard group); returns whether it
  // already was, so the caller can release_unit() what it gathered.
  bool acquire(int unit) override;
  void release_unit(int unit) override;

  int64_t gathered_bytes() const override { return gathered_bytes_; }  // alive now
  int64_t peak_gathered_bytes() const override { return peak_gathered_bytes_; }
  std::string describe() const override { return "zero-3 collectives"; }

 private:
  struct PendingReduce {  // a unit's reduce-scatter in flight
    WorkPtr work;
    Tensor grad_flat;  // kept alive until the reduction has read it
    Tensor partial;    // the result, to add into grad_shard; undefined: written there directly
  };
  struct UnitShard {
    Tensor param_shard;     // (shard_numel) the owned parameter values
    bool gathered = false;  // param_flat materialised (its gather may still be in flight)
    WorkPtr gather;
    int forward_uses = 0;
    bool shard_written = false;  // grad_shard holds this step's first reduction
    std::vector<PendingReduce> reduces;
  };
  struct Link {
    Zero3Gatherer* owner = nullptr;
  };

  int units() const { return buckets_.size(); }
  void gather_unit(int unit, bool prefetch);
  void wait_unit(int unit);
  void before_backward(int unit);
  void launch_unit(int unit, DpEventKind kind, bool sync);
  void finish_reduce(int unit);
  void reap_reductions();
  void track_gathered(int64_t delta);

  GradBuckets& buckets_;
  Communicator& shard_;
  GradSync& sync_;
  DpStepLog& log_;
  bool overlap_;
  std::vector<UnitShard> shards_;
  std::shared_ptr<Link> link_;  // the graph's unit-backward nodes reach this object only while
                                // it lives
  int64_t gathered_bytes_ = 0, peak_gathered_bytes_ = 0;
};

}  // namespace loom::parallel::dp
