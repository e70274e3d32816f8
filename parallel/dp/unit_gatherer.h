// parallel/dp/unit_gatherer.h — UnitGatherer: the parameter side of ZeRO-3 as DataParallel uses
// it (Note [ZeRO-3] in parallel/dp/data_parallel.h), whatever moves the bytes: the model's
// UnitHooks (gather a unit before use, release it after) plus the step's gradient end (a unit's
// gradient is complete; the step's end). The unit-hook schedule lives here, once: per-unit
// state (owned shard, gathered flag, fetch in flight, nested forward uses), just-in-time gathers
// with prefetch of the next unit in compute order, releases, the unit-backward identity, the
// gathered-bytes accounting. A scheme supplies the transfers through the protected virtuals:
// Zero3Gatherer (collectives: all-gather and reduce-scatter per unit, parallel/dp/zero3.h) and
// odc::OdcGatherer (one-sided pulls and pushes, synchronised once per step:
// parallel/odc/odc_gatherer.h). It owns no buckets, communicators or optimizer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "layers/unit_hooks.h"
#include "parallel/comm/communicator.h"
#include "parallel/dp/dp_stats.h"
#include "parallel/dp/grad_buckets.h"
#include "parallel/dp/grad_sync.h"

namespace loom::parallel::dp {

class UnitGatherer : public UnitHooks {
 public:
  ~UnitGatherer() override;
  UnitGatherer(const UnitGatherer&) = delete;
  UnitGatherer& operator=(const UnitGatherer&) = delete;

  // UnitHooks: gather unit u (and, from an outermost use, prefetch u+1); release it when its
  // last nested use ends, and wrap its output in an identity whose backward gathers it again
  // (prefetching u-1).
  void before_forward(int unit) final;
  Tensor after_forward(int unit, const Tensor& out) final;

  // Unit u's last gradient hook of this backward fired: release its parameters and send its
  // gradient on (now, or in finish() with overlap off). `sync`: the step's last micro-batch.
  void unit_gradients_ready(int unit, bool sync);
  // A new step (DataParallel::zero_grad): nothing may be in flight.
  virtual void start_step() = 0;
  // The step's end (DataParallel::finish_gradient_sync): every unit released, and each unit's
  // bucket grad_shard holds the gradient averaged over the data-parallel ranks.
  virtual void finish() = 0;
  // Unit u's owned parameter values (shard_numel), persistent: the optimiser's pieces view them.
  const Tensor& owned_values(int unit) const {
    return units_.at(static_cast<size_t>(unit)).param_shard;
  }
  // The owned values were written (the optimiser's step): collective over the shard group, every
  // rank calls it at the same point; ODC publishes them now (Note [ODC] in
  // parallel/odc/odc_gatherer.h).
  virtual void parameters_changed() {}
  // Writable views of the owned values were handed out (DataParallel::owned_pieces, e.g. for a
  // checkpoint load): ODC publishes them again at the next start_step() or acquire().
  virtual void parameters_may_change() {}
  // Gathers unit u now if it is not; returns whether it already was, so the caller can
  // release_unit() what it gathered. May be collective (ZeRO-3): call it on every rank.
  bool acquire(int unit);
  void release_unit(int unit);
  int64_t gathered_bytes() const { return gathered_bytes_; }  // alive now
  int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }
  // Bytes of communication buffers held for the whole run (ODC's windows), 0 for collectives.
  virtual int64_t window_bytes() const { return 0; }
  virtual std::string describe() const = 0;  // "zero-3 collectives", "odc (deterministic)"

 protected:
  // backward_node: the name of the unit-backward identity in the graph. All must outlive this.
  UnitGatherer(GradBuckets& buckets, DpStepLog& log, bool overlap, std::string backward_node);

  // Takes each unit's owned shard out of the buckets' parameter buffers and releases the
  // buffers (Note [Releasable storage]); the schemes call it once their checks have passed.
  void take_owned_shards();
  // The graph's unit-backward nodes stop reaching this object and every fetch in flight is
  // waited for (errors swallowed). A scheme's destructor calls it before its own members go.
  void detach() noexcept;
  int units() const { return buckets_.size(); }
  bool gathered(int unit) const { return units_.at(static_cast<size_t>(unit)).gathered; }
  // The step's end, first part: units whose gradient is still here (overlap off, or some
  // parameters got no gradient in the last backward) are sent (kLateLaunch); all are released.
  void send_remaining_and_release();
  // MiCS: one hop across replicas per unit, in unit order, each unit's grad_shard in place.
  void replica_hop(GradSync& sync);

  // Issues the transfer that fills unit u's flat parameter buffer `flat` (materialised) from
  // the owners' shards; returns its handle. fetch_op(): the gather events' detail.
  virtual WorkPtr fetch(int unit, const Tensor& flat) = 0;
  virtual std::string fetch_op() const = 0;
  // Unit u's backward begins, before its gradient views are attached: reap what finished.
  virtual void backward_begins() = 0;
  // Sends unit u's gradient buffer to its owners (kind: kLaunch from the hook, kLateLaunch).
  virtual void send_gradient(int unit, DpEventKind kind, bool sync) = 0;
  // Before acquire() looks at the unit (ODC: publish stale shards first).
  virtual void before_acquire() {}

  GradBuckets& buckets_;
  DpStepLog& log_;

 private:
  struct UnitState {
    Tensor param_shard;     // (shard_numel) the owned parameter values
    bool gathered = false;  // param_flat materialised (its fetch may still be in flight)
    WorkPtr fetch;
    int forward_uses = 0;
  };
  struct Link {
    UnitGatherer* owner = nullptr;
  };

  void gather_unit(int unit, bool prefetch);
  void wait_unit(int unit);
  void before_backward(int unit);
  void track_gathered(int64_t delta);

  bool overlap_;
  std::string backward_node_;
  std::vector<UnitState> units_;
  std::shared_ptr<Link> link_;  // the graph's unit-backward nodes reach this object only while
                                // it lives
  int64_t gathered_bytes_ = 0, peak_gathered_bytes_ = 0;
};

// Makes a stage-3 gatherer over DataParallel's buckets, shard group, sync strategy and event
// log (`overlap`: DataParallelConfig::overlap). The plan chooses the scheme (ZeRO-3's, ODC's).
using GathererFactory = std::function<std::unique_ptr<UnitGatherer>(
    GradBuckets& buckets, Communicator& shard, GradSync& sync, DpStepLog& log, bool overlap)>;

}  // namespace loom::parallel::dp
