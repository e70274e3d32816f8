// parallel/dp/zero3.cpp — Zero3Gatherer (see parallel/dp/zero3.h; Note [ZeRO-3] in
// parallel/dp/data_parallel.h): just-in-time gathers with prefetch, releases, the per-unit
// reduce-scatters launched from the gradient hooks, and the step's end. Nothing here plans
// buckets or runs the optimizer.
#include "parallel/dp/zero3.h"

#include <algorithm>
#include <chrono>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "kernels/copy.h"

namespace loom::parallel::dp {

Zero3Gatherer::Zero3Gatherer(GradBuckets& buckets, Communicator& shard, GradSync& sync,
                             DpStepLog& log, bool overlap)
    : buckets_(buckets),
      shard_(shard),
      sync_(sync),
      log_(log),
      overlap_(overlap),
      shards_(static_cast<size_t>(buckets.size())),
      link_(std::make_shared<Link>()) {
  LOOM_CHECK(sync.shards(), "data_parallel: ZeRO-3 needs a reduce-scatter gradient sync");
  for (int u = 0; u < units(); ++u) {
    GradBucket& b = buckets_.bucket(u);
    shards_[static_cast<size_t>(u)].param_shard =
        flat_view(b.param_flat, {b.plan.shard_numel}, buckets_.owned_begin(u)).clone();
    b.param_flat.storage()->release();  // Note [Releasable storage]
  }
  link_->owner = this;
}

Zero3Gatherer::~Zero3Gatherer() {
  link_->owner = nullptr;
  for (UnitShard& s : shards_) {
    try {
      if (s.gather) s.gather->wait();
      for (PendingReduce& r : s.reduces) r.work->wait();
    } catch (...) {  // a destructor must not throw; the error was the step's to report
    }
  }
}

void Zero3Gatherer::track_gathered(int64_t delta) {
  gathered_bytes_ += delta;
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
}

void Zero3Gatherer::gather_unit(int unit, bool prefetch) {
  UnitShard& s = shards_.at(static_cast<size_t>(unit));
  if (s.gathered) return;
  const Tensor& flat = buckets_.bucket(unit).param_flat;
  flat.storage()->materialize();
  track_gathered(static_cast<int64_t>(flat.nbytes()));
  s.gather = shard_.all_gather_async(s.param_shard, flat);
  s.gathered = true;
  log_.log(prefetch ? DpEventKind::kPrefetch : DpEventKind::kGather, unit,
           "all_gather " + shard_.name());
}

void Zero3Gatherer::wait_unit(int unit) {
  UnitShard& s = shards_.at(static_cast<size_t>(unit));
  if (!s.gather) return;
  const auto t0 = std::chrono::steady_clock::now();
  s.gather->wait();
  log_.add_blocked(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  s.gather.reset();
}

void Zero3Gatherer::release_unit(int unit) {
  UnitShard& s = shards_.at(static_cast<size_t>(unit));
  if (!s.gathered) return;
  wait_unit(unit);  // the communicator may still be writing into the buffer
  const Tensor& flat = buckets_.bucket(unit).param_flat;
  flat.storage()->release();
  s.gathered = false;
  track_gathered(-static_cast<int64_t>(flat.nbytes()));
  log_.log(DpEventKind::kRelease, unit, "");
}

bool Zero3Gatherer::acquire(int unit) {
  const bool was = shards_.at(static_cast<size_t>(unit)).gathered;
  gather_unit(unit, false);
  wait_unit(unit);
  return was;
}

void Zero3Gatherer::before_forward(int unit) {
  LOOM_CHECK(unit >= 0 && unit < units(), "data_parallel: unit ", unit, " out of range (", units(),
             " units)");
  const bool outermost = std::none_of(shards_.begin(), shards_.end(),
                                      [](const UnitShard& o) { return o.forward_uses > 0; });
  ++shards_[static_cast<size_t>(unit)].forward_uses;
  gather_unit(unit, false);
  wait_unit(unit);
  log_.log(DpEventKind::kUnitForward, unit, "");
  // Prefetch the next unit while this one computes (not from a nested use: a tied head
  // entering the embeddings again must not gather the first block).
  if (outermost && unit + 1 < units()) gather_unit(unit + 1, true);
}

Tensor Zero3Gatherer::after_forward(int unit, const Tensor& out) {
  UnitShard& s = shards_.at(static_cast<size_t>(unit));
  LOOM_CHECK(s.forward_uses > 0, "data_parallel: after_forward(", unit, ") without before_forward");
  log_.log(DpEventKind::kUnitForwardEnd, unit, "");
  if (--s.forward_uses == 0) release_unit(unit);
  if (!autograd::grad_enabled() || !out.requires_grad()) return out;
  // An identity whose backward runs before the unit's own backward nodes (it is newer than
  // all of them, and they depend on its output gradient).
  Tensor y = out.detach();
  std::shared_ptr<Link> link = link_;
  autograd::record_function("zero3_unit_backward", {out}, {&y},
                            [link, unit](const std::vector<Tensor>& g) {
                              if (link->owner != nullptr) link->owner->before_backward(unit);
                              return std::vector<Tensor>{g[0]};
                            });
  return y;
}

void Zero3Gatherer::before_backward(int unit) {
  log_.log(DpEventKind::kUnitBackward, unit, "");
  reap_reductions();
  buckets_.attach_grad_views(unit);  // AccumulateGrad adds straight into the unit's buffer
  gather_unit(unit, false);
  wait_unit(unit);
  if (unit > 0) gather_unit(unit - 1, true);  // backward runs the units in reverse
}

void Zero3Gatherer::unit_gradients_ready(int unit, bool sync) {
  // Every node reading these parameters has run (each delivers a gradient to them), so the
  // gathered copy can go now.
  release_unit(unit);
  buckets_.recount(unit);  // the next micro-batch counts again
  if (overlap_) launch_unit(unit, DpEventKind::kLaunch, sync);
  // Overlap off: the full unit gradient stays and is reduced in finish().
}

void Zero3Gatherer::launch_unit(int unit, DpEventKind kind, bool sync) {
  reap_reductions();  // free the gradient buffers of reductions that have completed
  UnitShard& s = shards_[static_cast<size_t>(unit)];
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
  UnitShard& s = shards_[static_cast<size_t>(unit)];
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
    UnitShard& s = shards_[static_cast<size_t>(u)];
    while (!s.reduces.empty() && s.reduces.front().work->is_done()) finish_reduce(u);
  }
}

void Zero3Gatherer::start_step() {
  for (int u = 0; u < units(); ++u) {
    UnitShard& s = shards_[static_cast<size_t>(u)];
    LOOM_CHECK(s.reduces.empty() && !buckets_.bucket(u).grad_flat.defined(),
               "data_parallel: zero_grad() with reductions in flight; call "
               "finish_gradient_sync() first");
    s.shard_written = false;
  }
  buckets_.clear_grads();
  buckets_.reset_counts();  // unit gradient buffers appear in each unit's backward
}

void Zero3Gatherer::finish() {
  for (int u = 0; u < units(); ++u) {
    // Overlap off, or a unit some of whose parameters got no gradient in the last backward.
    if (buckets_.bucket(u).grad_flat.defined()) launch_unit(u, DpEventKind::kLateLaunch, true);
    release_unit(u);
  }
  for (int u = 0; u < units(); ++u) {
    UnitShard& s = shards_[static_cast<size_t>(u)];
    while (!s.reduces.empty()) finish_reduce(u);
    if (!s.shard_written) kernels::call_kernel<kernels::fill_k>(buckets_.bucket(u).grad_shard, 0.0);
  }
  if (sync_.has_second_hop()) {  // MiCS: one hop across replicas per unit, in unit order
    std::vector<WorkPtr> works;
    for (int u = 0; u < units(); ++u) {
      works.push_back(sync_.second_hop(buckets_.bucket(u).grad_shard));
      log_.log(DpEventKind::kReplicaLaunch, u, sync_.second_op());
    }
    for (WorkPtr& w : works) w->wait();
  }
  buckets_.clear_grads();
  buckets_.reset_counts();
}

}  // namespace loom::parallel::dp
