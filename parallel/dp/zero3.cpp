// parallel/dp/zero3.cpp — Zero3Gatherer (see parallel/dp/zero3.h; Note [ZeRO-3] in
// parallel/dp/data_parallel.h): the all-gathers the shared hook schedule (UnitGatherer,
// parallel/dp/unit_gatherer.cpp) issues, the per-unit reduce-scatters launched from the gradient
// hooks, and the step's end. Nothing here plans buckets or runs the optimizer.
#include "parallel/dp/zero3.h"

#include <utility>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "kernels/copy.h"

namespace loom::parallel::dp {

Zero3Gatherer::Zero3Gatherer(GradBuckets& buckets, Communicator& shard, GradSync& sync,
                             DpStepLog& log, bool overlap)
    : UnitGatherer(buckets, log, overlap, "zero3_unit_backward"),
      shard_(shard),
      sync_(sync),
      reductions_(static_cast<size_t>(buckets.size())) {
  LOOM_CHECK(sync.shards(), "data_parallel: ZeRO-3 needs a reduce-scatter gradient sync");
  take_owned_shards();
}

Zero3Gatherer::~Zero3Gatherer() {
  detach();
  for (UnitReduces& s : reductions_) {
    try {
      for (PendingReduce& r : s.reduces) r.work->wait();
    } catch (...) {  // a destructor must not throw; the error was the step's to report
    }
  }
}

WorkPtr Zero3Gatherer::fetch(int unit, const Tensor& flat) {
  return shard_.all_gather_async(owned_values(unit), flat);
}

void Zero3Gatherer::send_gradient(int unit, DpEventKind kind, bool sync) {
  reap_reductions();  // free the gradient buffers of reductions that have completed
  UnitReduces& s = reductions_[static_cast<size_t>(unit)];
  const GradBucket& b = buckets_.bucket(unit);
  // The step's first reduction writes the shard; later micro-batches' are summed into it.
  Tensor partial;
  if (s.shard_written)
    partial = Tensor::empty({b.plan.shard_numel}, b.plan.dtype, b.param_flat.device());
  const Tensor grad = buckets_.take_grad_buffer(unit);
  WorkPtr work = sync_.first_hop(grad, partial.defined() ? partial : b.grad_shard);
  s.reduces.push_back({std::move(work), grad, partial});
  s.shard_written = true;
  if (kind == DpEventKind::kLaunch && sync) {
    log_.add_launched_early(static_cast<int64_t>(b.plan.bytes()));
  }
  log_.log(kind, unit, sync_.first_op());
}

void Zero3Gatherer::finish_reduce(int unit) {
  UnitReduces& s = reductions_[static_cast<size_t>(unit)];
  PendingReduce& r = s.reduces.front();
  r.work->wait();
  if (r.partial.defined()) {
    autograd::NoGradGuard no_grad;
    ops::add_(buckets_.bucket(unit).grad_shard, r.partial);
  }
  buckets_.grad_buffer_done(r.grad_flat.nbytes());
  s.reduces.erase(s.reduces.begin());
}

void Zero3Gatherer::reap_reductions() {
  for (int u = 0; u < units(); ++u) {
    UnitReduces& s = reductions_[static_cast<size_t>(u)];
    while (!s.reduces.empty() && s.reduces.front().work->is_done()) finish_reduce(u);
  }
}

void Zero3Gatherer::start_step() {
  for (int u = 0; u < units(); ++u) {
    UnitReduces& s = reductions_[static_cast<size_t>(u)];
    LOOM_CHECK(s.reduces.empty() && !buckets_.bucket(u).grad_flat.defined(),
               "data_parallel: zero_grad() with reductions in flight; call "
               "finish_gradient_sync() first");
    s.shard_written = false;
  }
  buckets_.clear_grads();
  buckets_.reset_counts();  // unit gradient buffers appear in each unit's backward
}

void Zero3Gatherer::finish() {
  send_remaining_and_release();
  for (int u = 0; u < units(); ++u) {
    UnitReduces& s = reductions_[static_cast<size_t>(u)];
    while (!s.reduces.empty()) finish_reduce(u);
    if (!s.shard_written) kernels::call_kernel<kernels::fill_k>(buckets_.bucket(u).grad_shard, 0.0);
  }
  replica_hop(sync_);  // MiCS: across replicas, in unit order
  buckets_.clear_grads();
  buckets_.reset_counts();
}

}  // namespace loom::parallel::dp
