// parallel/dp/zero3.cpp — DataParallel's stage 3 (Note [ZeRO-3] in parallel/dp/data_parallel.h):
// the unit hooks that gather parameters just in time and prefetch the next unit, the releases,
// the per-unit reduce-scatters launched from the gradient hooks, and the step's sync. Nothing
// here plans buckets or runs the optimiser (parallel/dp/data_parallel.cpp).
#include <algorithm>
#include <chrono>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "kernels/copy.h"
#include "parallel/dp/data_parallel.h"

namespace loom::parallel {

using dp::flat_view;

void DataParallel::track_bytes(int64_t param_delta, int64_t grad_delta) {
  gathered_bytes_ += param_delta;
  unit_grad_bytes_ += grad_delta;
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  peak_unit_grad_bytes_ = std::max(peak_unit_grad_bytes_, unit_grad_bytes_);
}

void DataParallel::init_shards() {
  for (Bucket& b : buckets_) {
    b.param_shard =
        flat_view(b.param_flat, {b.plan.shard_numel}, shard_rank() * b.plan.shard_numel).clone();
    b.param_flat.storage()->release();  // Note [Releasable storage]
    b.gathered = false;
  }
}

void DataParallel::gather_unit(int unit, bool prefetch) {
  Bucket& b = buckets_.at(static_cast<size_t>(unit));
  if (b.gathered) return;
  b.param_flat.storage()->materialize();
  track_bytes(static_cast<int64_t>(b.param_flat.nbytes()), 0);
  b.gather = shard_comm_->all_gather_async(b.param_shard, b.param_flat);
  b.gathered = true;
  log(prefetch ? DpEventKind::kPrefetch : DpEventKind::kGather, unit,
      "all_gather " + shard_comm_->name());
}

void DataParallel::wait_unit(int unit) {
  Bucket& b = buckets_.at(static_cast<size_t>(unit));
  if (!b.gather) return;
  b.gather->wait();
  b.gather.reset();
}

void DataParallel::release_unit(int unit) {
  Bucket& b = buckets_.at(static_cast<size_t>(unit));
  if (!b.gathered) return;
  wait_unit(unit);  // the communicator may still be writing into the buffer
  b.param_flat.storage()->release();
  b.gathered = false;
  track_bytes(-static_cast<int64_t>(b.param_flat.nbytes()), 0);
  log(DpEventKind::kRelease, unit, "");
}

void DataParallel::before_forward(int unit) {
  if (config_.zero_stage != 3) return;
  LOOM_CHECK(unit >= 0 && unit < num_buckets(), "data_parallel: unit ", unit, " out of range (",
             num_buckets(), " units)");
  Bucket& b = buckets_[static_cast<size_t>(unit)];
  const bool outermost = std::none_of(buckets_.begin(), buckets_.end(),
                                      [](const Bucket& o) { return o.forward_uses > 0; });
  ++b.forward_uses;
  gather_unit(unit, false);
  wait_unit(unit);
  log(DpEventKind::kUnitForward, unit, "");
  // Prefetch the next unit while this one computes (not from a nested use: a tied head
  // entering the embeddings again must not gather the first block).
  if (outermost && unit + 1 < num_buckets()) gather_unit(unit + 1, true);
}

Tensor DataParallel::after_forward(int unit, const Tensor& out) {
  if (config_.zero_stage != 3) return out;
  Bucket& b = buckets_.at(static_cast<size_t>(unit));
  LOOM_CHECK(b.forward_uses > 0, "data_parallel: after_forward(", unit, ") without before_forward");
  log(DpEventKind::kUnitForwardEnd, unit, "");
  if (--b.forward_uses == 0) release_unit(unit);
  if (!autograd::grad_enabled() || !out.requires_grad()) return out;
  // An identity whose backward runs before the unit's own backward nodes (it is newer than
  // all of them, and they depend on its output gradient).
  Tensor y = out.detach();
  std::shared_ptr<HookLink> link = link_;
  autograd::record_function("zero3_unit_backward", {out}, {&y},
                            [link, unit](const std::vector<Tensor>& g) {
                              if (link->owner != nullptr) link->owner->before_backward(unit);
                              return std::vector<Tensor>{g[0]};
                            });
  return y;
}

void DataParallel::before_backward(int unit) {
  Bucket& b = buckets_.at(static_cast<size_t>(unit));
  log(DpEventKind::kUnitBackward, unit, "");
  reap_reductions();
  ensure_grad_buffer(b);  // AccumulateGrad adds straight into the unit's gradient buffer
  for (size_t k : b.plan.params) attach_grad_view(k);
  gather_unit(unit, false);
  wait_unit(unit);
  if (unit > 0) gather_unit(unit - 1, true);  // backward runs the units in reverse
}

void DataParallel::unit_gradients_ready(int unit) {
  Bucket& b = buckets_[static_cast<size_t>(unit)];
  // Every node reading these parameters has run (each delivers a gradient to them), so the
  // gathered copy can go now.
  release_unit(unit);
  b.pending = static_cast<int>(b.plan.params.size());  // the next micro-batch counts again
  if (config_.overlap) launch_unit(unit, DpEventKind::kLaunch);
  // Overlap off: the full unit gradient stays and is reduced in finish_gradient_sync.
}

void DataParallel::launch_unit(int unit, DpEventKind kind) {
  reap_reductions();  // free the gradient buffers of reductions that have completed
  Bucket& b = buckets_[static_cast<size_t>(unit)];
  // The step's first reduction writes the shard; later micro-batches' are summed into it.
  Tensor partial;
  if (b.shard_written)
    partial = Tensor::empty({b.plan.shard_numel}, b.plan.dtype, b.grad_flat.device());
  WorkPtr work = grad_sync_->first_hop(b.grad_flat, partial.defined() ? partial : b.grad_shard);
  b.reduces.push_back({std::move(work), b.grad_flat, partial});
  b.shard_written = true;
  b.grad_flat = Tensor();
  for (size_t k : b.plan.params) params_[k].tensor.zero_grad();
  if (kind == DpEventKind::kLaunch && sync_) {
    current_.launched_early_bytes += static_cast<int64_t>(b.plan.bytes());
  }
  log(kind, unit, grad_sync_->first_op());
}

void DataParallel::finish_reduce(Bucket& b) {
  PendingReduce& r = b.reduces.front();
  r.work->wait();
  if (r.partial.defined()) {
    autograd::NoGradGuard no_grad;
    ops::add_(b.grad_shard, r.partial);
  }
  track_bytes(0, -static_cast<int64_t>(r.grad_flat.nbytes()));
  b.reduces.erase(b.reduces.begin());
}

void DataParallel::reap_reductions() {
  for (Bucket& b : buckets_) {
    while (!b.reduces.empty() && b.reduces.front().work->is_done()) finish_reduce(b);
  }
}

void DataParallel::finish_zero3() {
  const auto t0 = std::chrono::steady_clock::now();
  log(DpEventKind::kFinishBegin, -1, "");
  for (int u = 0; u < num_buckets(); ++u) {
    // Overlap off, or a unit some of whose parameters got no gradient in the last backward.
    if (buckets_[static_cast<size_t>(u)].grad_flat.defined())
      launch_unit(u, DpEventKind::kLateLaunch);
    release_unit(u);
  }
  for (Bucket& b : buckets_) {
    while (!b.reduces.empty()) finish_reduce(b);
    if (!b.shard_written) kernels::call_kernel<kernels::fill_k>(b.grad_shard, 0.0);
  }
  if (grad_sync_->has_second_hop()) {  // MiCS: one hop across replicas per unit, in unit order
    std::vector<WorkPtr> works;
    for (int u = 0; u < num_buckets(); ++u) {
      works.push_back(grad_sync_->second_hop(buckets_[static_cast<size_t>(u)].grad_shard));
      log(DpEventKind::kReplicaLaunch, u, grad_sync_->second_op());
    }
    for (WorkPtr& w : works) w->wait();
  }
  for (Param& p : params_) p.tensor.zero_grad();
  log(DpEventKind::kFinishEnd, -1, "");
  current_.grad_bytes = 0;
  for (const Bucket& b : buckets_) current_.grad_bytes += static_cast<int64_t>(b.plan.bytes());
  current_.exposed_wait_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  last_stats_ = std::move(current_);
  current_ = DpStepStats{};
  reset_counters();
  synced_ = true;
}

NamedTensors DataParallel::full_parameters() {
  std::vector<Tensor> copies(params_.size());
  for (int u = 0; u < num_buckets(); ++u) {
    Bucket& b = buckets_[static_cast<size_t>(u)];
    const bool was_gathered = b.gathered;
    if (config_.zero_stage == 3) {
      gather_unit(u, false);
      wait_unit(u);
    }
    for (size_t k : b.plan.params) copies[k] = params_[k].tensor.detach().clone();
    if (config_.zero_stage == 3 && !was_gathered) release_unit(u);
  }
  NamedTensors out;
  for (size_t k = 0; k < params_.size(); ++k) out.emplace_back(params_[k].name, copies[k]);
  return out;
}

}  // namespace loom::parallel
