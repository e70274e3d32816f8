// parallel/dp/data_parallel.cpp — DataParallel (see parallel/dp/data_parallel.h): bucket
// buffers, the gradient-ready hooks that launch each bucket's sync (the strategy: parallel/dp/
// grad_sync.h), the wait for it, and the optimizer over the owned pieces (parallel/dp/
// sharded_optimizer.h) with its parameter all-gather. Stage 3's unit gathers, releases and
// per-unit reductions are in parallel/dp/zero3.cpp.
#include "parallel/dp/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_set>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "kernels/copy.h"
#include "optim/adamw.h"
#include "parallel/dp/sharded_optimizer.h"

namespace loom::parallel {

using dp::flat_view;

namespace {
// "<param>[<begin>:<end>]", element offsets in the flattened parameter.
std::string piece_name(const std::string& param, int64_t begin, int64_t end) {
  return param + "[" + std::to_string(begin) + ":" + std::to_string(end) + "]";
}
}  // namespace

DataParallel::DataParallel(const NamedTensors& named, Communicator& dp,
                           const DataParallelConfig& config, MicsGroups mics)
    : DataParallel(std::vector<NamedTensors>{named}, dp, config, mics, false) {}

DataParallel::DataParallel(const std::vector<NamedTensors>& units, Communicator& dp,
                           const DataParallelConfig& config, MicsGroups mics)
    : DataParallel(units, dp, config, mics, true) {}

DataParallel::DataParallel(const std::vector<NamedTensors>& units, Communicator& dp,
                           const DataParallelConfig& config, MicsGroups mics, bool per_unit)
    : dp_(dp),
      shard_comm_(mics.partition != nullptr ? mics.partition : &dp),
      replica_comm_(mics.replica),
      config_(config),
      grad_sync_(dp::make_grad_sync(config.zero_stage, dp, *shard_comm_, replica_comm_)),
      link_(std::make_shared<HookLink>()) {
  validate_groups(mics, per_unit);
  build_buckets(units, per_unit);
  for (Param& p : params_) {  // every replica holds the same values (Note [Placement])
    Placement pl = p.tensor.placement();
    for (const std::string& axis : config_.axes) pl.add_replicated(axis);
    p.tensor.set_placement(std::move(pl));
  }
  if (config_.broadcast_parameters) broadcast_parameters();
  if (config_.zero_stage == 3) init_shards();
  zero_grad();
  build_optimizer();
  install_hooks();
  link_->owner = this;
}

DataParallel::~DataParallel() {
  link_->owner = nullptr;
  for (Bucket& b : buckets_) {
    try {
      if (b.first) b.first->wait();
      if (b.second) b.second->wait();
      if (b.gather) b.gather->wait();
      for (PendingReduce& r : b.reduces) r.work->wait();
    } catch (...) {  // a destructor must not throw; the error was the step's to report
    }
  }
}

void DataParallel::validate_groups(MicsGroups mics, bool per_unit) const {
  const int stage = config_.zero_stage;
  LOOM_CHECK(stage >= 0 && stage <= 3, "data_parallel: zero_stage must be 0, 1, 2 or 3, got ",
             stage);
  LOOM_CHECK(stage < 3 || per_unit,
             "data_parallel: ZeRO-3 gathers parameters per unit; build DataParallel from "
             "parameter units (Transformer::parameter_units())");
  LOOM_CHECK((mics.partition == nullptr) == (mics.replica == nullptr),
             "data_parallel: MiCS needs both the partition and the replica communicator");
  if (mics.partition == nullptr) return;
  LOOM_CHECK(stage >= 1, "data_parallel: MiCS shards optimiser state; it needs zero_stage >= 1");
  LOOM_CHECK(mics.partition->size() * mics.replica->size() == dp_.size(),
             "data_parallel: MiCS partition size ", mics.partition->size(), " × replica size ",
             mics.replica->size(), " != dp size ", dp_.size());
}

void DataParallel::build_buckets(const std::vector<NamedTensors>& units, bool per_unit) {
  std::vector<std::vector<size_t>> groups;  // parameter indices planned together
  std::unordered_set<const TensorImpl*> seen;
  for (size_t u = 0; u < units.size(); ++u) {
    if (per_unit || groups.empty()) groups.emplace_back();
    for (const auto& [name, t] : units[u]) {
      if (!t.defined() || !t.requires_grad()) continue;  // frozen: not data-parallel state
      LOOM_CHECK(seen.insert(t.impl()).second, "data_parallel: parameter '", name,
                 "' is listed twice (list a tied parameter once)");
      params_.push_back({name, t, optim::decays(config_.decay_rule, name, t.shape()), 0, 0});
      groups.back().push_back(params_.size() - 1);
    }
    LOOM_CHECK(!per_unit || !groups.back().empty(), "data_parallel: parameter unit ", u,
               " has no trainable parameters");
  }
  LOOM_CHECK(!params_.empty(), "data_parallel: no trainable parameters");
  for (const std::vector<size_t>& group : groups) {
    std::vector<Tensor> tensors;
    size_t group_bytes = 0;
    for (size_t i : group) {
      tensors.push_back(params_[i].tensor);
      group_bytes += params_[i].tensor.nbytes();
    }
    const size_t budget = per_unit ? group_bytes + 1 : config_.bucket_bytes;  // a unit: 1 bucket
    std::vector<dp::BucketPlan> plans = dp::plan_buckets(tensors, budget, shard_comm_->size());
    LOOM_CHECK(!per_unit || plans.size() == 1, "data_parallel: parameter unit ", buckets_.size(),
               " mixes dtypes; a unit must be one bucket");
    for (dp::BucketPlan& plan : plans) {
      Bucket b;
      b.plan = std::move(plan);
      for (size_t& k : b.plan.params) k = group[k];  // group-local → global parameter index
      const Device device = params_[b.plan.params[0]].tensor.device();
      b.param_flat = Tensor::zeros({b.plan.padded_numel}, b.plan.dtype, device);
      for (size_t k = 0; k < b.plan.params.size(); ++k) {
        Param& p = params_[b.plan.params[k]];
        p.bucket = static_cast<int>(buckets_.size());
        p.offset = b.plan.offsets[k];
        dp::rehome_parameter(p.tensor, b.param_flat, p.offset);
      }
      if (config_.zero_stage >= 2) {
        b.grad_shard = Tensor::zeros({b.plan.shard_numel}, b.plan.dtype, device);
      }
      buckets_.push_back(std::move(b));
    }
  }
}

template <typename Fn>
void DataParallel::for_each_owned_piece(Fn&& fn) const {
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    const Bucket& b = buckets_[bi];
    const int64_t own_begin = shard_rank() * b.plan.shard_numel;
    const int64_t own_end = own_begin + b.plan.shard_numel;
    for (size_t k = 0; k < b.plan.params.size(); ++k) {
      const Param& p = params_[b.plan.params[k]];
      const int64_t lo = std::max(p.offset, own_begin);
      const int64_t hi = std::min(p.offset + p.tensor.numel(), own_end);
      if (lo < hi) fn(static_cast<int>(bi), p, lo, hi);
    }
  }
}

void DataParallel::broadcast_parameters() {
  std::vector<WorkPtr> works;
  for (Bucket& b : buckets_) works.push_back(dp_.broadcast_async(b.param_flat, 0));
  for (WorkPtr& w : works) w->wait();
}

void DataParallel::build_optimizer() {
  const optim::OptimizerFactory inner =
      config_.optimizer
          ? config_.optimizer
          : [](std::vector<optim::ParamRef> refs) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(std::move(refs), 0.9, 0.95, 1e-8, 0.0);
  };
  std::vector<optim::ParamRef> refs;
  if (config_.zero_stage == 0) {  // the whole parameters, replicated: the inner optimizer alone
    for (const Param& p : params_) refs.push_back({p.name, p.tensor, p.decay});
    optimizer_ = inner(std::move(refs));
    LOOM_CHECK(optimizer_ != nullptr, "DataParallel: the optimizer factory made no optimizer");
    return;
  }
  for (const auto& [name, view] : parameter_shards()) refs.push_back({name, view, true});
  size_t k = 0;
  for_each_owned_piece([&](int bucket, const Param& p, int64_t lo, int64_t hi) {
    refs[k++].decay = p.decay;
    pieces_.push_back({bucket, lo, hi});
  });
  // Stages 1-2 all-gather the updated shards; stage 3's next forward gathers per unit.
  const bool gather = config_.zero_stage < 3;
  optimizer_ = std::make_unique<dp::ShardedOptimizer>(
      std::move(refs), inner, [this](size_t i) { return piece_grad(i); },
      [this, gather] {
        if (gather) gather_parameters();
      });
}

NamedTensors DataParallel::parameter_shards() const {
  NamedTensors out;
  if (config_.zero_stage == 0) {
    for (const Param& p : params_) out.emplace_back(p.name, p.tensor);
    return out;
  }
  for_each_owned_piece([&](int bucket, const Param& p, int64_t lo, int64_t hi) {
    const Bucket& b = buckets_[static_cast<size_t>(bucket)];
    const Tensor view = config_.zero_stage == 3 ? flat_view(b.param_shard, {hi - lo},
                                                            lo - shard_rank() * b.plan.shard_numel)
                                                : flat_view(b.param_flat, {hi - lo}, lo);
    out.emplace_back(piece_name(p.name, lo - p.offset, hi - p.offset), view);
  });
  return out;
}

void DataParallel::install_hooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    std::shared_ptr<HookLink> link = link_;
    params_[i].tensor.register_grad_ready_hook([link, i](Tensor& leaf) {
      if (link->owner != nullptr) link->owner->on_grad_ready(i, leaf);
    });
  }
}

void DataParallel::log(DpEventKind kind, int bucket, std::string detail) {
  current_.events.push_back({next_seq_++, kind, bucket, std::move(detail)});
}

void DataParallel::ensure_grad_buffer(Bucket& b) {
  if (!b.grad_flat.defined()) {
    b.grad_flat = Tensor::zeros({b.plan.padded_numel}, b.plan.dtype, b.param_flat.device());
    if (config_.zero_stage == 3) track_bytes(0, static_cast<int64_t>(b.grad_flat.nbytes()));
  }
}

void DataParallel::attach_grad_view(size_t index) {
  Param& p = params_[index];
  Bucket& b = buckets_[static_cast<size_t>(p.bucket)];
  ensure_grad_buffer(b);
  p.tensor.set_grad(flat_view(b.grad_flat, p.tensor.shape(), p.offset));
}

void DataParallel::on_grad_ready(size_t index, Tensor& leaf) {
  Param& p = params_[index];
  Bucket& b = buckets_[static_cast<size_t>(p.bucket)];
  log(DpEventKind::kHook, p.bucket, p.name);
  LOOM_CHECK(!b.launched, "data_parallel: gradient of '", p.name, "' arrived after bucket ",
             p.bucket,
             " was reduced; call finish_gradient_sync() and step() before another "
             "backward, or set_sync(false) for accumulation micro-batches");
  // The gradient must live in the bucket (it does not when .grad was cleared behind our back:
  // AccumulateGrad then assigned a fresh tensor). Copy it in and point .grad back.
  const Tensor g = leaf.grad();
  ensure_grad_buffer(b);
  const bool in_bucket = g.defined() && g.storage() == b.grad_flat.storage() &&
                         g.offset() == b.grad_flat.offset() + p.offset && g.is_contiguous();
  if (!in_bucket) {
    Tensor view = flat_view(b.grad_flat, p.tensor.shape(), p.offset);
    autograd::NoGradGuard no_grad;
    ops::copy_(view, g);
    leaf.set_grad(view);
  }
  if (--b.pending > 0) return;
  if (config_.zero_stage == 3) {
    unit_gradients_ready(p.bucket);
  } else if (!sync_) {
    b.pending = static_cast<int>(b.plan.params.size());  // accumulation: next micro-batch
  } else if (config_.overlap) {
    launch(p.bucket, DpEventKind::kLaunch);
  }  // else finish_gradient_sync launches it: overlap switched off for comparison
}

void DataParallel::launch(int bucket, DpEventKind kind) {
  Bucket& b = buckets_[static_cast<size_t>(bucket)];
  ensure_grad_buffer(b);
  b.launched = true;
  b.first = grad_sync_->first_hop(b.grad_flat, b.grad_shard);
  launch_order_.push_back(bucket);
  if (kind == DpEventKind::kLaunch) {
    current_.launched_early_bytes += static_cast<int64_t>(b.plan.bytes());
  }
  log(kind, bucket, grad_sync_->first_op());
}

void DataParallel::reset_counters() {
  for (Bucket& b : buckets_) {
    if (!b.launched) b.pending = static_cast<int>(b.plan.params.size());
  }
}

void DataParallel::zero_grad() {
  LOOM_CHECK(launch_order_.empty(),
             "data_parallel: zero_grad() with reductions in flight; call "
             "finish_gradient_sync() first");
  if (config_.zero_stage == 3) {  // unit gradient buffers appear in each unit's backward
    for (Bucket& b : buckets_) {
      LOOM_CHECK(b.reduces.empty() && !b.grad_flat.defined(),
                 "data_parallel: zero_grad() with reductions in flight; call "
                 "finish_gradient_sync() first");
      b.shard_written = false;
    }
    for (Param& p : params_) p.tensor.zero_grad();
    reset_counters();
    synced_ = false;
    return;
  }
  for (Bucket& b : buckets_) {
    if (b.grad_flat.defined()) {
      kernels::call_kernel<kernels::fill_k>(b.grad_flat, 0.0);
    } else {
      ensure_grad_buffer(b);
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) attach_grad_view(i);
  reset_counters();
  synced_ = false;
}

void DataParallel::set_sync(bool sync) {
  sync_ = sync;
  reset_counters();
}

void DataParallel::finish_gradient_sync() {
  LOOM_CHECK(sync_,
             "data_parallel: finish_gradient_sync() under set_sync(false); call "
             "set_sync(true) before the last micro-batch's backward");
  if (config_.zero_stage == 3) {
    finish_zero3();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  log(DpEventKind::kFinishBegin, -1, "");
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    if (!buckets_[bi].launched) launch(static_cast<int>(bi), DpEventKind::kLateLaunch);
  }
  for (int bi : launch_order_) {  // same order on every rank, so comm order matches too
    Bucket& b = buckets_[static_cast<size_t>(bi)];
    b.first->wait();
    if (grad_sync_->has_second_hop()) {
      b.second = grad_sync_->second_hop(b.grad_shard);
      log(DpEventKind::kReplicaLaunch, bi, grad_sync_->second_op());
    }
  }
  for (int bi : launch_order_) {
    Bucket& b = buckets_[static_cast<size_t>(bi)];
    if (b.second) b.second->wait();
    b.first.reset();
    b.second.reset();
    b.launched = false;
  }
  if (config_.zero_stage >= 2) {  // only the reduced shard is kept (Note [ZeRO memory formulas])
    for (Param& p : params_) p.tensor.zero_grad();
    for (Bucket& b : buckets_) b.grad_flat = Tensor();
  }
  log(DpEventKind::kFinishEnd, -1, "");
  current_.grad_bytes = 0;
  for (const Bucket& b : buckets_) current_.grad_bytes += static_cast<int64_t>(b.plan.bytes());
  current_.exposed_wait_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  last_stats_ = std::move(current_);
  current_ = DpStepStats{};
  launch_order_.clear();
  reset_counters();
  synced_ = true;
}

// The gradient of optimiser piece k (stages >= 1): a view of the bucket's flat gradient (stage 1,
// whole buckets reduced) or of its reduced shard (stages 2, 3).
Tensor DataParallel::piece_grad(size_t k) const {
  const Piece& pc = pieces_[k];
  const Bucket& b = buckets_[static_cast<size_t>(pc.bucket)];
  const int64_t len = pc.end - pc.begin;
  return config_.zero_stage == 1
             ? flat_view(b.grad_flat, {len}, pc.begin)
             : flat_view(b.grad_shard, {len}, pc.begin - shard_rank() * b.plan.shard_numel);
}

NamedTensors DataParallel::owned_grad_pieces() const {
  NamedTensors out;
  if (config_.zero_stage == 0) {
    for (const Param& p : params_) {
      out.emplace_back(p.name, flat_view(buckets_[static_cast<size_t>(p.bucket)].grad_flat,
                                         {p.tensor.numel()}, p.offset));
    }
    return out;
  }
  const std::vector<optim::ParamRef>& refs = optimizer_->params();
  for (size_t k = 0; k < refs.size(); ++k) out.emplace_back(refs[k].name, piece_grad(k));
  return out;
}

std::vector<GradPiece> DataParallel::grad_pieces() {
  if (!synced_) finish_gradient_sync();
  std::vector<GradPiece> out;
  if (config_.zero_stage == 0) {  // whole gradients, replicated over config.axes
    for (const Param& p : params_) {
      out.push_back({flat_view(buckets_[static_cast<size_t>(p.bucket)].grad_flat,
                               {p.tensor.numel()}, p.offset),
                     p.tensor.placement()});
    }
    return out;
  }
  size_t k = 0;  // the optimizer's pieces, in the same order
  for_each_owned_piece([&](int, const Param& p, int64_t lo, int64_t hi) {
    Placement pl = p.tensor.placement();  // of the whole parameter: replicated over config.axes
    for (const std::string& axis : config_.axes) pl.remove_replicated(axis);
    if (replica_comm_ != nullptr) pl.add_replicated(config_.replica_axis);
    pl.global_shape = {hi - lo};  // a 1-d piece: only `replicated` and `tied_to` matter here
    pl.splits.clear();
    out.push_back({piece_grad(k++), std::move(pl)});
  });
  return out;
}

void DataParallel::step(double lr) { step_scaled(lr, Tensor()); }

void DataParallel::step_scaled(double lr, const Tensor& grad_scale) {
  if (!synced_) finish_gradient_sync();
  optimizer_->step_scaled(lr, grad_scale);  // sharded: then the all-gather (stages 1-2)
  synced_ = false;
}

void DataParallel::gather_parameters() {
  std::vector<Tensor> shards;
  std::vector<WorkPtr> works;
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    // A copy: the communicator's in and out must not alias.
    shards.push_back(
        flat_view(b.param_flat, {b.plan.shard_numel}, shard_rank() * b.plan.shard_numel).clone());
    works.push_back(shard_comm_->all_gather_async(shards.back(), b.param_flat));
    log(DpEventKind::kGather, static_cast<int>(bi), "all_gather " + shard_comm_->name());
  }
  for (WorkPtr& w : works) w->wait();
}

std::vector<std::pair<std::string, Tensor>> DataParallel::state_tensors() {
  return optimizer_->state_tensors();
}

DpMemory DataParallel::memory() const {
  DpMemory m;
  for (const Bucket& b : buckets_) {
    const int64_t e = static_cast<int64_t>(dtype_size(b.plan.dtype));
    if (config_.zero_stage == 3) {
      m.param_bytes += b.plan.shard_numel * e;
      m.grad_bytes += b.plan.shard_numel * e;
      continue;
    }
    m.param_bytes += b.plan.padded_numel * e;
    if (config_.zero_stage >= 2) {
      m.grad_bytes += b.plan.shard_numel * e;
      m.transient_grad_bytes += b.plan.padded_numel * e;
    } else {
      m.grad_bytes += b.plan.padded_numel * e;
    }
  }
  for (const auto& [name, t] : optimizer_->state_tensors()) {
    m.optimizer_bytes += static_cast<int64_t>(t.nbytes());
  }
  if (config_.zero_stage == 3) {
    m.transient_param_bytes = peak_gathered_bytes_;
    m.transient_grad_bytes = peak_unit_grad_bytes_;
  }
  return m;
}

DpMemory DataParallel::memory_formula() const {
  // The inner optimizer's state tensors per parameter piece: AdamW 2, SGD with momentum 1.
  const size_t pieces = std::max<size_t>(1, optimizer_->params().size());
  const int states = static_cast<int>(optimizer_->state_tensors().size() / pieces);
  return zero_memory_formula(num_parameters(), dtype_size(buckets_[0].plan.dtype),
                             config_.zero_stage, shard_count(), states);
}

int64_t DataParallel::num_parameters() const {
  int64_t n = 0;
  for (const Bucket& b : buckets_) n += b.plan.numel;
  return n;
}

std::vector<std::string> DataParallel::bucket_param_names(int b) const {
  std::vector<std::string> names;
  for (size_t k : buckets_.at(static_cast<size_t>(b)).plan.params) names.push_back(params_[k].name);
  return names;
}

std::string DataParallel::describe() const {
  std::string s = "data parallel: " + dp_.name() + " " + std::to_string(dp_.size()) +
                  ", zero stage " + std::to_string(config_.zero_stage) + ", shards over " +
                  shard_comm_->name() + " (" + std::to_string(shard_count()) + ")";
  if (replica_comm_ != nullptr) s += ", replicas over " + replica_comm_->name();
  s += ", " + std::to_string(buckets_.size()) +
       (config_.zero_stage == 3 ? " units, " : " buckets, ") + std::to_string(num_parameters()) +
       " parameters; per rank " + format_memory(memory(), memory_formula());
  return s;
}

}  // namespace loom::parallel
