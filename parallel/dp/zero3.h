// parallel/dp/zero3.h — Zero3Gatherer: ZeRO-3's parameter side with collectives, installed as
// the model's UnitHooks (layers/unit_hooks.h). Between uses a rank keeps only its shard of each
// unit's parameters; the gatherer all-gathers a unit just in time (prefetching the next one in
// compute order), releases it after use, and reduce-scatters the unit's gradient as soon as its
// last hook fires (Note [ZeRO-3] in parallel/dp/data_parallel.h). Buckets are units here: bucket
// u of the GradBuckets is unit u. The hook schedule and the owned parameter shards are its base
// UnitGatherer's (parallel/dp/unit_gatherer.h); this class issues the all-gathers and owns the
// reductions in flight. It does not own the buckets, the communicators, the sync strategy or the
// optimizer. ODC's one-sided UnitGatherer is parallel/odc/odc_gatherer.h.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
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

  // A new step: no reduction may be in flight; the shards are written afresh.
  void start_step() override;
  // The step's end: launches what is left, releases every unit, waits for every reduction
  // (summing the micro-batches' into each unit's grad_shard) and runs MiCS's second hop.
  void finish() override;
  std::string describe() const override { return "zero-3 collectives"; }

 private:
  struct PendingReduce {  // a unit's reduce-scatter in flight
    WorkPtr work;
    Tensor grad_flat;  // kept alive until the reduction has read it
    Tensor partial;    // the result, to add into grad_shard; undefined: written there directly
  };
  struct UnitReduces {
    bool shard_written = false;  // grad_shard holds this step's first reduction
    std::vector<PendingReduce> reduces;
  };

  // UnitGatherer: all-gather over the shard group; reap finished reductions; reduce-scatter.
  WorkPtr fetch(int unit, const Tensor& flat) override;
  std::string fetch_op() const override { return "all_gather " + shard_.name(); }
  void backward_begins() override { reap_reductions(); }
  void send_gradient(int unit, DpEventKind kind, bool sync) override;

  void finish_reduce(int unit);
  void reap_reductions();

  Communicator& shard_;
  GradSync& sync_;
  std::vector<UnitReduces> reductions_;
};

}  // namespace loom::parallel::dp
