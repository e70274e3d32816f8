// parallel/dp/grad_sync.h — GradSync: how one bucket's gradient is synchronised over the
// data-parallel group, the strategy DataParallel composes with its buckets and its optimizer
// (DESIGN §5.10, "data parallelism in parts"):
//   AllReduceSync     DDP and ZeRO-1: all_reduce(avg) of the whole flat gradient, in place;
//   ReduceScatterSync ZeRO-2/3: reduce_scatter(avg) into the rank's owned shard, and with a
//                     replica group (MiCS, HSDP) a second hop, all_reduce(avg) of that shard
//                     across the replicas.
// The first hop is issued from the bucket's last gradient hook while backward runs; the second
// once the first is done, in launch order on every rank. A fork's strategy (ODC's one-sided
// pushes to the owners) implements the same interface. Nothing here owns buffers or waits.
#pragma once

#include <memory>
#include <string>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::dp {

class GradSync {
 public:
  virtual ~GradSync() = default;
  // Whether the result is the owned shard (reduce-scatter) rather than the whole gradient.
  virtual bool shards() const = 0;
  // The first hop of one bucket, asynchronous: `grad` the padded flat gradient; `out` the
  // owned shard when shards(), else ignored (the result replaces `grad`).
  virtual WorkPtr first_hop(const Tensor& grad, const Tensor& out) = 0;
  // The second hop on the first hop's result (the shard), or null when there is none.
  virtual WorkPtr second_hop(const Tensor&) { return nullptr; }
  virtual bool has_second_hop() const { return false; }
  // "all_reduce dp", "reduce_scatter mics_partition", …: the event log's words.
  virtual std::string first_op() const = 0;
  virtual std::string second_op() const { return ""; }
};

// The strategy of a ZeRO stage: stages 0-1 all-reduce over `group`; stages 2-3 reduce-scatter
// over `shard` (the group, or the MiCS partition) and, with `replica`, all-reduce across it.
std::unique_ptr<GradSync> make_grad_sync(int zero_stage, Communicator& group, Communicator& shard,
                                         Communicator* replica);

}  // namespace loom::parallel::dp
