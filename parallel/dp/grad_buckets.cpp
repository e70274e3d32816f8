// parallel/dp/grad_buckets.cpp — GradBuckets (see parallel/dp/grad_buckets.h): building the buckets
// and re-homing the parameters, the gradient buffers and their views, and the grad-ready hooks.
#include "parallel/dp/grad_buckets.h"

#include <unordered_set>

#include "core/autograd.h"
#include "core/ops/view.h"
#include "kernels/copy.h"

namespace loom::parallel::dp {

GradBuckets::GradBuckets(const std::vector<NamedTensors>& units, const GradBucketsOptions& options,
                         DpStepLog& log)
    : options_(options), log_(log), link_(std::make_shared<HookLink>()) {
  LOOM_CHECK(options.shard_rank >= 0 && options.shard_rank < options.shard_count,
             "data_parallel: shard rank ", options.shard_rank, " outside ", options.shard_count,
             " shards");
  build(units);
  link_->owner = this;
}

GradBuckets::~GradBuckets() { link_->owner = nullptr; }

void GradBuckets::build(const std::vector<NamedTensors>& units) {
  const bool per_unit = options_.per_unit;
  std::vector<std::vector<size_t>> groups;  // parameter indices planned together
  std::unordered_set<const TensorImpl*> seen;
  for (size_t u = 0; u < units.size(); ++u) {
    if (per_unit || groups.empty()) groups.emplace_back();
    for (const auto& [name, t] : units[u]) {
      if (!t.defined() || !t.requires_grad()) continue;  // frozen: not data-parallel state
      LOOM_CHECK(seen.insert(t.impl()).second, "data_parallel: parameter '", name,
                 "' is listed twice (list a tied parameter once)");
      params_.push_back({name, t, optim::decays(options_.decay_rule, name, t.shape()), 0, 0});
      groups.back().push_back(params_.size() - 1);
    }
    LOOM_CHECK(!per_unit || !groups.back().empty(), "data_parallel: parameter unit ", u,
               " has no trainable parameters");
  }
  LOOM_CHECK(!params_.empty(), "data_parallel: no trainable parameters");
  for (const std::vector<size_t>& group : groups) {
    std::vector<Tensor> tensors;
    std::vector<bool> alone;
    size_t group_bytes = 0;
    for (size_t i : group) {
      tensors.push_back(params_[i].tensor);
      alone.push_back(!per_unit && options_.alone && options_.alone(params_[i].tensor));
      group_bytes += params_[i].tensor.nbytes();
    }
    const size_t budget = per_unit ? group_bytes + 1 : options_.bucket_bytes;  // a unit: 1 bucket
    std::vector<BucketPlan> plans = plan_buckets(tensors, budget, options_.shard_count, alone);
    LOOM_CHECK(!per_unit || plans.size() == 1, "data_parallel: parameter unit ", buckets_.size(),
               " mixes dtypes; a unit must be one bucket");
    for (BucketPlan& plan : plans) {
      GradBucket b;
      b.plan = std::move(plan);
      for (size_t& k : b.plan.params) k = group[k];  // group-local → global parameter index
      const Device device = params_[b.plan.params[0]].tensor.device();
      b.param_flat = Tensor::zeros({b.plan.padded_numel}, b.plan.dtype, device);
      for (size_t k = 0; k < b.plan.params.size(); ++k) {
        BucketParam& p = params_[b.plan.params[k]];
        p.bucket = static_cast<int>(buckets_.size());
        p.offset = b.plan.offsets[k];
        rehome_parameter(p.tensor, b.param_flat, p.offset);
      }
      if (options_.shard_grads) {
        b.grad_shard = Tensor::zeros({b.plan.shard_numel}, b.plan.dtype, device);
      }
      buckets_.push_back(std::move(b));
    }
  }
}

void GradBuckets::install_hooks(std::function<void(int bucket)> on_complete) {
  LOOM_CHECK(!on_complete_, "data_parallel: gradient hooks installed twice");
  on_complete_ = std::move(on_complete);
  for (size_t i = 0; i < params_.size(); ++i) {
    std::shared_ptr<HookLink> link = link_;
    params_[i].tensor.register_grad_ready_hook([link, i](Tensor& leaf) {
      if (link->owner != nullptr) link->owner->on_grad_ready(i, leaf);
    });
  }
}

void GradBuckets::install_partial_hooks(
    std::function<bool(size_t param, const Tensor& g)> on_partial) {
  auto shared = std::make_shared<std::function<bool(size_t, const Tensor&)>>(std::move(on_partial));
  for (size_t i = 0; i < params_.size(); ++i) {
    std::shared_ptr<HookLink> link = link_;
    params_[i].tensor.register_grad_partial_hook([link, shared, i](Tensor&, const Tensor& g) {
      return link->owner != nullptr && (*shared)(i, g);
    });
  }
}

void GradBuckets::on_grad_ready(size_t index, Tensor& leaf) {
  BucketParam& p = params_[index];
  GradBucket& b = bucket(p.bucket);
  log_.log(DpEventKind::kHook, p.bucket, p.name);
  LOOM_CHECK(!b.sealed, "data_parallel: gradient of '", p.name, "' arrived after bucket ", p.bucket,
             " was reduced; call finish_gradient_sync() and step() before another "
             "backward, or set_sync(false) for accumulation micro-batches");
  // The gradient must live in the bucket (it does not when .grad was cleared behind our back:
  // AccumulateGrad then assigned a fresh tensor). Copy it in and point .grad back.
  const Tensor g = leaf.grad();
  ensure_grad_buffer(p.bucket);
  const bool in_bucket = g.defined() && g.storage() == b.grad_flat.storage() &&
                         g.offset() == b.grad_flat.offset() + p.offset && g.is_contiguous();
  if (!in_bucket) {
    Tensor view = flat_view(b.grad_flat, p.tensor.shape(), p.offset);
    autograd::NoGradGuard no_grad;
    ops::copy_(view, g);
    leaf.set_grad(view);
  }
  if (--b.pending == 0) on_complete_(p.bucket);
}

void GradBuckets::ensure_grad_buffer(int bi) {
  GradBucket& b = bucket(bi);
  if (b.grad_flat.defined()) return;
  b.grad_flat = Tensor::zeros({b.plan.padded_numel}, b.plan.dtype, b.param_flat.device());
  grad_bytes_ += static_cast<int64_t>(b.grad_flat.nbytes());
  peak_grad_bytes_ = std::max(peak_grad_bytes_, grad_bytes_);
}

void GradBuckets::attach_grad_views(int bi) {
  ensure_grad_buffer(bi);
  const GradBucket& b = bucket(bi);
  for (size_t k : b.plan.params) {
    BucketParam& p = params_[k];
    p.tensor.set_grad(flat_view(b.grad_flat, p.tensor.shape(), p.offset));
  }
}

void GradBuckets::zero() {
  for (int bi = 0; bi < size(); ++bi) {
    GradBucket& b = bucket(bi);
    if (b.grad_flat.defined()) kernels::call_kernel<kernels::fill_k>(b.grad_flat, 0.0);
    attach_grad_views(bi);
  }
  reset_counts();
}

Tensor GradBuckets::take_grad_buffer(int bi) {
  GradBucket& b = bucket(bi);
  Tensor out = std::move(b.grad_flat);
  b.grad_flat = Tensor();
  for (size_t k : b.plan.params) params_[k].tensor.zero_grad();
  return out;
}

void GradBuckets::clear_grads() {
  for (BucketParam& p : params_) p.tensor.zero_grad();
}

void GradBuckets::grad_buffer_done(size_t bytes) { grad_bytes_ -= static_cast<int64_t>(bytes); }

void GradBuckets::drop_grad_buffer(int bi) {
  const Tensor t = take_grad_buffer(bi);
  if (t.defined()) grad_buffer_done(t.nbytes());
}

void GradBuckets::reset_counts() {
  for (GradBucket& b : buckets_) {
    if (!b.sealed) b.pending = static_cast<int>(b.plan.params.size());
  }
}

void GradBuckets::recount(int bi) {
  GradBucket& b = bucket(bi);
  b.pending = static_cast<int>(b.plan.params.size());
}

int64_t GradBuckets::num_parameters() const {
  int64_t n = 0;
  for (const GradBucket& b : buckets_) n += b.plan.numel;
  return n;
}

std::vector<std::string> GradBuckets::param_names(int b) const {
  std::vector<std::string> names;
  for (size_t k : bucket(b).plan.params) names.push_back(params_[k].name);
  return names;
}

}  // namespace loom::parallel::dp
