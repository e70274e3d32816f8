// parallel/dp/data_parallel.cpp — DataParallel (see parallel/dp/data_parallel.h): building the
// parts (buckets, sync strategy, ZeRO-3 gatherer, sharded optimizer), launching a complete
// bucket's sync from its hooks, the step's wait, the owned pieces and their placements, the
// parameter all-gather after the update, and memory. The buckets themselves are in
// parallel/dp/grad_buckets.cpp, stage 3's gathers and per-unit reductions in zero3.cpp.
#include "parallel/dp/data_parallel.h"

#include <algorithm>
#include <chrono>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "kernels/copy.h"
#include "optim/adamw.h"
#include "parallel/dp/sharded_optimizer.h"
#include "parallel/dp/sparse_rows.h"
#include "parallel/dp/zero3.h"

namespace loom::parallel {

using dp::BucketParam;
using dp::flat_view;
using dp::GradBucket;

namespace {
// A parameter that may be reduced by rows (Note [Early contributions and sparse rows]): a host
// table, tall as embedding tables are (vocabulary ≫ width); no block's weight is 8× taller
// than wide.
bool rows_table(const Tensor& t) {
  return t.dim() == 2 && t.shape()[0] >= 8 * t.shape()[1] && t.device().is_cpu();
}

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
      grad_sync_(dp::make_grad_sync(config.zero_stage, dp, *shard_comm_, replica_comm_)) {
  validate_groups(mics, per_unit);
  dp::GradBucketsOptions bo;
  bo.bucket_bytes = config.bucket_bytes;
  bo.per_unit = per_unit;
  bo.shard_count = shard_comm_->size();
  bo.shard_rank = shard_comm_->rank();
  bo.shard_grads = config.zero_stage >= 2;
  bo.decay_rule = config.decay_rule;
  // Note [Early contributions and sparse rows]: stages 0-1 (no gatherer), overlap on, dp > 1;
  // a table that may be reduced by rows gets a bucket of its own.
  shortcuts_ = config.zero_stage <= 1 && dp.size() > 1 && config.overlap && config.table_shortcuts;
  if (shortcuts_) bo.alone = [](const Tensor& t) { return rows_table(t); };
  buckets_ = std::make_unique<dp::GradBuckets>(units, bo, log_);
  in_flight_.resize(static_cast<size_t>(buckets_->size()));
  for (const BucketParam& p : buckets_->params()) {  // every replica holds the same values
    Placement pl = p.tensor.placement();             // (Note [Placement])
    for (const std::string& axis : config_.axes) pl.add_replicated(axis);
    Tensor t = p.tensor;
    t.set_placement(std::move(pl));
  }
  if (config_.broadcast_parameters) broadcast_parameters();
  if (config_.zero_stage == 3 && config_.gatherer) {  // the plan's (ODC's)
    gatherer_ = config_.gatherer(*buckets_, *shard_comm_, *grad_sync_, log_, config_.overlap);
  } else if (config_.zero_stage == 3) {
    gatherer_ = std::make_unique<dp::Zero3Gatherer>(*buckets_, *shard_comm_, *grad_sync_, log_,
                                                    config_.overlap);
  }
  zero_grad();
  build_optimizer();
  buckets_->install_hooks([this](int b) { on_bucket_complete(b); });
  row_mode_.assign(in_flight_.size(), RowMode::kUntried);
  deferred_.assign(in_flight_.size(), 0);
  early_launched_.assign(in_flight_.size(), 0);
  if (shortcuts_) {
    buckets_->install_partial_hooks([this](size_t p, const Tensor& g) { return on_partial(p, g); });
  }
}

DataParallel::~DataParallel() {
  for (Early& e : early_) {
    try {
      e.work->wait();
    } catch (...) {  // as below
    }
  }
  for (InFlight& f : in_flight_) {
    try {
      if (f.first) f.first->wait();
      if (f.second) f.second->wait();
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
  LOOM_CHECK(stage == 3 || !config_.gatherer,
             "data_parallel: a parameter gatherer (ODC's) needs zero_stage 3, got ", stage);
  LOOM_CHECK((mics.partition == nullptr) == (mics.replica == nullptr),
             "data_parallel: MiCS needs both the partition and the replica communicator");
  if (mics.partition == nullptr) return;
  LOOM_CHECK(stage >= 1, "data_parallel: MiCS shards optimiser state; it needs zero_stage >= 1");
  LOOM_CHECK(mics.partition->size() * mics.replica->size() == dp_.size(),
             "data_parallel: MiCS partition size ", mics.partition->size(), " × replica size ",
             mics.replica->size(), " != dp size ", dp_.size());
}

void DataParallel::broadcast_parameters() {
  std::vector<WorkPtr> works;
  for (int b = 0; b < buckets_->size(); ++b)
    works.push_back(dp_.broadcast_async(buckets_->bucket(b).param_flat, 0));
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
    for (const BucketParam& p : buckets_->params()) refs.push_back({p.name, p.tensor, p.decay});
    optimizer_ = inner(std::move(refs));
    LOOM_CHECK(optimizer_ != nullptr, "DataParallel: the optimizer factory made no optimizer");
    return;
  }
  for (HeldPiece& p : owned_pieces())
    refs.push_back({std::move(p.name), std::move(p.values), true});
  size_t k = 0;
  buckets_->for_each_owned_piece([&](int bucket, const BucketParam& p, int64_t lo, int64_t hi) {
    refs[k++].decay = p.decay;
    ranges_.push_back({bucket, lo, hi});
  });
  // Stages 1-2 all-gather the updated shards; stage 3's next forward gathers per unit.
  const bool gather = config_.zero_stage < 3;
  optimizer_ = std::make_unique<dp::ShardedOptimizer>(
      std::move(refs), inner, [this](size_t i) { return piece_grad(i); },
      [this, gather] {
        if (gather) gather_parameters();
        if (gatherer_) gatherer_->parameters_changed();  // ODC publishes the updated shards
      });
}

std::vector<HeldPiece> DataParallel::owned_pieces() const {
  std::vector<HeldPiece> out;
  if (config_.zero_stage == 0) {
    for (const BucketParam& p : buckets_->params()) out.push_back(held_whole(p.name, p.tensor));
    return out;
  }
  if (gatherer_) gatherer_->parameters_may_change();  // the views are writable
  buckets_->for_each_owned_piece([&](int bucket, const BucketParam& p, int64_t lo, int64_t hi) {
    const Tensor view = gatherer_ ? flat_view(gatherer_->owned_values(bucket), {hi - lo},
                                              lo - buckets_->owned_begin(bucket))
                                  : flat_view(buckets_->bucket(bucket).param_flat, {hi - lo}, lo);
    const Placement whole = p.tensor.placement();
    out.push_back({piece_name(p.name, lo - p.offset, hi - p.offset), p.name, view,
                   piece_of(whole, p.tensor.shape(), lo - p.offset, hi - p.offset),
                   owned_placement(p)});
  });
  return out;
}

std::vector<HeldPiece> DataParallel::held_parameters() const {
  if (config_.zero_stage == 3) return owned_pieces();
  std::vector<HeldPiece> out;
  for (const BucketParam& p : buckets_->params()) out.push_back(held_whole(p.name, p.tensor));
  return out;
}

std::optional<NamedTensors> DataParallel::whole_parameters() {
  if (config_.zero_stage < 3) return std::nullopt;
  return full_parameters();
}

void DataParallel::on_bucket_complete(int bucket) {
  if (gatherer_) {
    gatherer_->unit_gradients_ready(bucket, sync_);
  } else if (!sync_) {
    buckets_->recount(bucket);  // accumulation: the next micro-batch counts again
  } else if (config_.overlap) {
    launch(bucket, DpEventKind::kLaunch);
  }  // else finish_gradient_sync launches it: overlap switched off for comparison
}

void DataParallel::launch(int bucket, DpEventKind kind) {
  buckets_->ensure_grad_buffer(bucket);
  GradBucket& b = buckets_->bucket(bucket);
  b.sealed = true;
  if (probe_) {  // this rank's gradient, before the reduction overwrites it
    autograd::NoGradGuard no_grad;
    const Tensor s = ops::sum_squares(b.grad_flat);
    probe_sq_ = probe_sq_.defined() ? ops::add(probe_sq_, s) : s;
  }
  if (rows_candidate(bucket)) {  // Note [Early contributions and sparse rows]
    deferred_[static_cast<size_t>(bucket)] = 1;
    launch_order_.push_back(bucket);
    log_.log(DpEventKind::kDeferred, bucket, "sparse rows");
    return;
  }
  in_flight_[static_cast<size_t>(bucket)].first = grad_sync_->first_hop(b.grad_flat, b.grad_shard);
  launch_order_.push_back(bucket);
  if (kind == DpEventKind::kLaunch) log_.add_launched_early(static_cast<int64_t>(b.plan.bytes()));
  log_.log(kind, bucket, grad_sync_->first_op());
}

bool DataParallel::on_partial(size_t param, const Tensor& g) {
  // An accumulation micro-batch, or a probed one (probe_unreduced_grads): the engine sums it as
  // before.
  if (!sync_ || probe_) return false;
  const BucketParam& p = buckets_->params()[param];
  buckets_->ensure_grad_buffer(p.bucket);
  GradBucket& b = buckets_->bucket(p.bucket);
  const int64_t n = p.tensor.numel();
  Tensor view = flat_view(b.grad_flat, {n}, p.offset);  // the parameter's .grad, flat
  autograd::NoGradGuard no_grad;
  Tensor sum = ops::add(view, ops::reshape(ops::to_dtype(g, view.dtype()), {n})).contiguous();
  kernels::call_kernel<kernels::fill_k>(view, 0.0);
  early_.push_back({param, sum, dp_.all_reduce_async(sum, ReduceOp::kAvg)});
  early_launched_[static_cast<size_t>(p.bucket)] = 1;
  log_.log(DpEventKind::kEarlyLaunch, p.bucket, p.name);
  return true;
}

bool DataParallel::rows_candidate(int bucket) const {
  if (!shortcuts_ || row_mode_[static_cast<size_t>(bucket)] == RowMode::kDense) return false;
  const GradBucket& b = buckets_->bucket(bucket);
  if (b.plan.params.size() != 1) return false;
  return rows_table(buckets_->params()[b.plan.params[0]].tensor);
}

void DataParallel::reduce_rows(int bucket) {
  const size_t bi = static_cast<size_t>(bucket);
  GradBucket& b = buckets_->bucket(bucket);
  const BucketParam& p = buckets_->params()[b.plan.params[0]];
  Tensor g = flat_view(b.grad_flat, p.tensor.shape(), p.offset);
  const dp::SparseRowsResult r = dp::all_reduce_rows_avg(g, dp_);
  row_mode_[bi] = r.sparse ? RowMode::kSparse : RowMode::kDense;
  log_.log(DpEventKind::kSparseRows, bucket,
           p.name + ": " + std::to_string(r.rows_sent) + " of " +
               std::to_string(p.tensor.shape()[0]) + " rows");
  // Its dense part went in backward when an early contribution carried it.
  if (early_launched_[bi]) log_.add_launched_early(static_cast<int64_t>(b.plan.bytes()));
  deferred_[bi] = 0;
}

void DataParallel::zero_grad() {
  LOOM_CHECK(launch_order_.empty(),
             "data_parallel: zero_grad() with reductions in flight; call "
             "finish_gradient_sync() first");
  if (gatherer_)
    gatherer_->start_step();
  else
    buckets_->zero();
  synced_ = false;
}

bool DataParallel::probe_unreduced_grads(bool on) {
  if (on && (config_.zero_stage > 1 || gatherer_)) return false;
  probe_ = on;
  probe_sq_ = Tensor();
  return true;
}

Tensor DataParallel::local_grad_sum_squares() {
  if (probe_) return probe_sq_;
  if (config_.zero_stage > 1 || sync_ || gatherer_) return Tensor();
  autograd::NoGradGuard no_grad;
  Tensor sum;
  for (int b = 0; b < buckets_->size(); ++b) {
    const Tensor& g = buckets_->bucket(b).grad_flat;
    if (!g.defined()) continue;
    const Tensor s = ops::sum_squares(g);
    sum = sum.defined() ? ops::add(sum, s) : s;
  }
  return sum;
}

void DataParallel::set_sync(bool sync) {
  sync_ = sync;
  buckets_->reset_counts();
}

void DataParallel::finish_gradient_sync() {
  LOOM_CHECK(sync_,
             "data_parallel: finish_gradient_sync() under set_sync(false); call "
             "set_sync(true) before the last micro-batch's backward");
  const auto t0 = std::chrono::steady_clock::now();
  log_.log(DpEventKind::kFinishBegin, -1, "");
  if (gatherer_)
    gatherer_->finish();
  else
    finish_buckets();
  log_.log(DpEventKind::kFinishEnd, -1, "");
  int64_t grad_bytes = 0;
  for (int b = 0; b < buckets_->size(); ++b)
    grad_bytes += static_cast<int64_t>(buckets_->bucket(b).plan.bytes());
  log_.close(grad_bytes,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  synced_ = true;
}

// Stages 0-2: launch what the hooks did not, wait for every first hop in launch order (issuing
// MiCS's second hop as each completes, so every rank issues each communicator's ops in the same
// order), then for the second hops.
void DataParallel::finish_buckets() {
  for (int b = 0; b < buckets_->size(); ++b) {
    if (!buckets_->bucket(b).sealed) launch(b, DpEventKind::kLateLaunch);
  }
  for (int bi : launch_order_) {
    InFlight& f = in_flight_[static_cast<size_t>(bi)];
    if (deferred_[static_cast<size_t>(bi)]) {  // stages 0-1 only: no second hop
      reduce_rows(bi);
      continue;
    }
    f.first->wait();
    if (grad_sync_->has_second_hop()) {
      f.second = grad_sync_->second_hop(buckets_->bucket(bi).grad_shard);
      log_.log(DpEventKind::kReplicaLaunch, bi, grad_sync_->second_op());
    }
  }
  for (int bi : launch_order_) {
    InFlight& f = in_flight_[static_cast<size_t>(bi)];
    if (f.second) f.second->wait();
    f = InFlight{};
    buckets_->bucket(bi).sealed = false;
  }
  for (Early& e : early_) {  // the early contributions join the rest, averaged alike
    e.work->wait();
    const BucketParam& p = buckets_->params()[e.param];
    Tensor view = flat_view(buckets_->bucket(p.bucket).grad_flat, {p.tensor.numel()}, p.offset);
    autograd::NoGradGuard no_grad;
    ops::add_(view, e.sum);
  }
  early_.clear();
  std::fill(early_launched_.begin(), early_launched_.end(), 0);
  if (config_.zero_stage >= 2) {  // only the reduced shard is kept (Note [ZeRO memory formulas])
    for (int b = 0; b < buckets_->size(); ++b) buckets_->drop_grad_buffer(b);
  }
  launch_order_.clear();
  buckets_->reset_counts();
}

// The gradient of optimiser piece k (stages >= 1): a view of the bucket's flat gradient (stage 1,
// whole buckets reduced) or of its reduced shard (stages 2, 3).
Tensor DataParallel::piece_grad(size_t k) const {
  const OwnedRange& pc = ranges_[k];
  const GradBucket& b = buckets_->bucket(pc.bucket);
  const int64_t len = pc.end - pc.begin;
  return config_.zero_stage == 1
             ? flat_view(b.grad_flat, {len}, pc.begin)
             : flat_view(b.grad_shard, {len}, pc.begin - buckets_->owned_begin(pc.bucket));
}

NamedTensors DataParallel::owned_grad_pieces() const {
  NamedTensors out;
  if (config_.zero_stage == 0) {
    for (const BucketParam& p : buckets_->params()) {
      out.emplace_back(
          p.name, flat_view(buckets_->bucket(p.bucket).grad_flat, {p.tensor.numel()}, p.offset));
    }
    return out;
  }
  const std::vector<optim::ParamRef>& refs = optimizer_->params();
  for (size_t k = 0; k < refs.size(); ++k) out.emplace_back(refs[k].name, piece_grad(k));
  return out;
}

std::vector<HeldPiece> DataParallel::grad_pieces() {
  if (!synced_) finish_gradient_sync();
  std::vector<HeldPiece> out;
  if (config_.zero_stage == 0) return whole_gradients();  // replicated over the axes
  size_t k = 0;  // the optimizer's pieces, in the same order
  buckets_->for_each_owned_piece([&](int, const BucketParam& p, int64_t lo, int64_t hi) {
    Placement pl = owned_placement(p);
    pl.global_shape = {hi - lo};  // a 1-d piece: only `replicated` and `tied_to` matter here
    pl.splits.clear();
    out.push_back({piece_name(p.name, lo - p.offset, hi - p.offset), p.name, piece_grad(k++),
                   piece_of(p.tensor.placement(), p.tensor.shape(), lo - p.offset, hi - p.offset),
                   std::move(pl)});
  });
  return out;
}

std::vector<HeldPiece> DataParallel::exchange_gradients() {
  return config_.zero_stage == 1 ? whole_gradients() : std::vector<HeldPiece>{};
}

std::vector<HeldPiece> DataParallel::whole_gradients() const {
  std::vector<HeldPiece> out;  // stages 0-1: every bucket was all-reduced whole
  for (const BucketParam& p : buckets_->params()) {
    const Placement pl = p.tensor.placement();
    out.push_back({p.name, p.name,
                   flat_view(buckets_->bucket(p.bucket).grad_flat, {p.tensor.numel()}, p.offset),
                   piece_of(pl, p.tensor.shape()), pl});
  }
  return out;
}

Placement DataParallel::owned_placement(const BucketParam& p) const {
  Placement pl = p.tensor.placement();  // of the whole parameter: replicated over config.axes
  for (const std::string& axis : config_.axes) pl.remove_replicated(axis);
  if (replica_comm_ != nullptr) pl.add_replicated(config_.replica_axis);
  return pl;
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
  for (int bi = 0; bi < buckets_->size(); ++bi) {
    GradBucket& b = buckets_->bucket(bi);
    // A copy: the communicator's in and out must not alias.
    shards.push_back(
        flat_view(b.param_flat, {b.plan.shard_numel}, buckets_->owned_begin(bi)).clone());
    works.push_back(shard_comm_->all_gather_async(shards.back(), b.param_flat));
    log_.log(DpEventKind::kGather, bi, "all_gather " + shard_comm_->name());
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (WorkPtr& w : works) w->wait();
  // Exposed: the next step's forward needs these parameters (counted in the step window that
  // began at this step's finish_gradient_sync, DpStepStats).
  log_.add_blocked(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

NamedTensors DataParallel::full_parameters() {
  const std::vector<BucketParam>& params = buckets_->params();
  std::vector<Tensor> copies(params.size());
  for (int u = 0; u < buckets_->size(); ++u) {
    const bool was_gathered = gatherer_ ? gatherer_->acquire(u) : true;
    for (size_t k : buckets_->bucket(u).plan.params) copies[k] = params[k].tensor.detach().clone();
    if (!was_gathered) gatherer_->release_unit(u);
  }
  NamedTensors out;
  for (size_t k = 0; k < params.size(); ++k) out.emplace_back(params[k].name, copies[k]);
  return out;
}

std::vector<std::pair<std::string, Tensor>> DataParallel::state_tensors() {
  return optimizer_->state_tensors();
}

DpMemory DataParallel::memory() const {
  DpMemory m;
  for (int bi = 0; bi < buckets_->size(); ++bi) {
    const dp::BucketPlan& plan = buckets_->bucket(bi).plan;
    const int64_t e = static_cast<int64_t>(dtype_size(plan.dtype));
    if (config_.zero_stage == 3) {
      m.param_bytes += plan.shard_numel * e;
      m.grad_bytes += plan.shard_numel * e;
      continue;
    }
    m.param_bytes += plan.padded_numel * e;
    if (config_.zero_stage >= 2) {
      m.grad_bytes += plan.shard_numel * e;
      m.transient_grad_bytes += plan.padded_numel * e;
    } else {
      m.grad_bytes += plan.padded_numel * e;
    }
  }
  for (const auto& [name, t] : optimizer_->state_tensors()) {
    m.optimizer_bytes += static_cast<int64_t>(t.nbytes());
  }
  if (gatherer_) {
    m.transient_param_bytes = gatherer_->peak_gathered_bytes();
    m.transient_grad_bytes = buckets_->peak_grad_buffer_bytes();
  }
  return m;
}

DpMemory DataParallel::memory_formula() const {
  // The inner optimizer's state tensors per parameter piece: AdamW 2, SGD with momentum 1.
  const size_t pieces = std::max<size_t>(1, optimizer_->params().size());
  const int states = static_cast<int>(optimizer_->state_tensors().size() / pieces);
  return zero_memory_formula(num_parameters(), dtype_size(buckets_->bucket(0).plan.dtype),
                             config_.zero_stage, shard_count(), states);
}

std::string DataParallel::describe() const {
  std::string s = "data parallel: " + dp_.name() + " " + std::to_string(dp_.size()) +
                  ", zero stage " + std::to_string(config_.zero_stage) + ", shards over " +
                  shard_comm_->name() + " (" + std::to_string(shard_count()) + ")";
  if (replica_comm_ != nullptr) s += ", replicas over " + replica_comm_->name();
  s += ", " + std::to_string(buckets_->size()) +
       (config_.zero_stage == 3 ? " units, " : " buckets, ") + std::to_string(num_parameters()) +
       " parameters; per rank " + format_memory(memory(), memory_formula());
  if (gatherer_) {
    s += "; " + gatherer_->describe();
    if (gatherer_->window_bytes() > 0)
      s += ", windows " + std::to_string(gatherer_->window_bytes() >> 10) + " KiB";
  }
  return s;
}

}  // namespace loom::parallel
