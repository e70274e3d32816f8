// parallel/dp/unit_gatherer.h — UnitGatherer: the parameter side of ZeRO-3 as DataParallel uses
// it (Note [ZeRO-3] in parallel/dp/data_parallel.h), whatever moves the bytes: the model's
// UnitHooks (gather a unit before use, release it after) plus the step's gradient end (a unit's
// gradient is complete; the step's end). Implementations: Zero3Gatherer (collectives:
// all-gather and reduce-scatter per unit, parallel/dp/zero3.h) and odc::OdcGatherer (one-sided
// pulls and pushes, synchronised once per step: parallel/odc/odc_gatherer.h). Interface only.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "layers/unit_hooks.h"

namespace loom::parallel::dp {

class UnitGatherer : public UnitHooks {
 public:
  // Unit u's last gradient hook of this backward fired: release its parameters and send its
  // gradient on (now, or in finish() with overlap off). `sync`: the step's last micro-batch.
  virtual void unit_gradients_ready(int unit, bool sync) = 0;
  // A new step (DataParallel::zero_grad): nothing may be in flight.
  virtual void start_step() = 0;
  // The step's end (DataParallel::finish_gradient_sync): every unit released, and each unit's
  // bucket grad_shard holds the gradient averaged over the data-parallel ranks.
  virtual void finish() = 0;
  // Unit u's owned parameter values (shard_numel), persistent: the optimiser's pieces view them.
  virtual const Tensor& owned_values(int unit) const = 0;
  // The owned values were written (the optimiser's step): collective over the shard group, every
  // rank calls it at the same point; ODC publishes them now (Note [ODC] in odc_gatherer.h).
  virtual void parameters_changed() {}
  // Writable views of the owned values were handed out (DataParallel::owned_pieces, e.g. for a
  // checkpoint load): ODC publishes them again at the next start_step() or acquire().
  virtual void parameters_may_change() {}
  // Gathers unit u now if it is not; returns whether it already was, so the caller can
  // release_unit() what it gathered. May be collective (ZeRO-3): call it on every rank.
  virtual bool acquire(int unit) = 0;
  virtual void release_unit(int unit) = 0;
  virtual int64_t gathered_bytes() const = 0;  // alive now
  virtual int64_t peak_gathered_bytes() const = 0;
  // Bytes of communication buffers held for the whole run (ODC's windows), 0 for collectives.
  virtual int64_t window_bytes() const { return 0; }
  virtual std::string describe() const = 0;  // "zero-3 collectives", "odc (deterministic)"
};

}  // namespace loom::parallel::dp
