// parallel/odc/odc_gatherer.cpp — OdcGatherer (see parallel/odc/odc_gatherer.h, Note [ODC]): the
// windows' layout, pulls with prefetch in rotated owner order, pushes from the gradient hooks,
// the step's one synchronisation and the publication of updated shards. The hook schedule
// (nested uses of a tied unit, the unit-backward identity) is Zero3Gatherer's
// (parallel/dp/zero3.cpp); only the transfers differ.
#include "parallel/odc/odc_gatherer.h"

#include <algorithm>
#include <chrono>

#include "core/autograd.h"

namespace loom::parallel::odc {

using dp::flat_view;
using dp::GradBucket;

int64_t odc_slot_numel(const dp::GradBuckets& buckets) {
  int64_t n = 0;
  for (int u = 0; u < buckets.size(); ++u) n += buckets.bucket(u).plan.shard_numel;
  return n;
}

namespace {
DType units_dtype(const dp::GradBuckets& buckets) {
  const DType t = buckets.bucket(0).plan.dtype;
  for (int u = 1; u < buckets.size(); ++u) {
    LOOM_CHECK(buckets.bucket(u).plan.dtype == t, "parallel.odc: unit ", u, " is ",
               dtype_name(buckets.bucket(u).plan.dtype), ", unit 0 ", dtype_name(t),
               "; ODC's windows hold one dtype");
  }
  return t;
}
bool on_cuda(const dp::GradBuckets& buckets) {
  return !buckets.bucket(0).param_flat.device().is_cpu();
}

// CUDA windows take pushes into per-origin slots only (Note [ODC over CUDA IPC]).
OdcOptions effective(const dp::GradBuckets& buckets, OdcOptions options) {
  if (on_cuda(buckets)) options.deterministic = true;
  return options;
}

std::unique_ptr<OneSidedWindow> make_window(Communicator& shard, const dp::GradBuckets& buckets,
                                            int64_t numel, std::string name, double timeout_s) {
  if (on_cuda(buckets)) {
    return make_cuda_ipc_window(shard, numel, units_dtype(buckets),
                                buckets.bucket(0).param_flat.device().index, std::move(name));
  }
  return make_mpi_window(shard, numel, units_dtype(buckets), std::move(name), timeout_s);
}
}  // namespace

OdcGatherer::OdcGatherer(dp::GradBuckets& buckets, Communicator& shard, dp::GradSync& sync,
                         DpStepLog& log, const OdcOptions& options)
    : OdcGatherer(buckets,
                  make_window(shard, buckets, odc_slot_numel(buckets),
                              "odc parameters " + shard.name(), options.timeout_s),
                  make_window(shard, buckets,
                              odc_slot_numel(buckets) *
                                  (effective(buckets, options).deterministic ? shard.size() : 1),
                              "odc gradients " + shard.name(), options.timeout_s),
                  sync, log, effective(buckets, options)) {}

OdcGatherer::OdcGatherer(dp::GradBuckets& buckets, std::unique_ptr<OneSidedWindow> params,
                         std::unique_ptr<OneSidedWindow> grads, dp::GradSync& sync, DpStepLog& log,
                         const OdcOptions& options)
    : buckets_(buckets),
      params_(std::move(params)),
      grads_(std::move(grads)),
      sync_(sync),
      log_(log),
      options_(options),
      units_(static_cast<size_t>(buckets.size())),
      link_(std::make_shared<Link>()) {
  init();
  link_->owner = this;
}

void OdcGatherer::init() {
  const int S = params_->size();
  LOOM_CHECK(S == buckets_.shard_count() && params_->rank() == buckets_.shard_rank() &&
                 grads_->size() == S && grads_->rank() == params_->rank(),
             "parallel.odc: the windows' group (rank ", params_->rank(), " of ", S,
             ") is not the buckets' shard group (rank ", buckets_.shard_rank(), " of ",
             buckets_.shard_count(), ")");
  for (int u = 0; u < units(); ++u) {
    offsets_.push_back(total_);
    total_ += buckets_.bucket(u).plan.shard_numel;
  }
  const int64_t slots = options_.deterministic ? S : 1;
  LOOM_CHECK(params_->numel() == total_ && grads_->numel() == slots * total_,
             "parallel.odc: windows of ", params_->numel(), " and ", grads_->numel(),
             " elements; the units need ", total_, " and ", slots * total_);
  for (int u = 0; u < units(); ++u) {
    GradBucket& b = buckets_.bucket(u);
    units_[static_cast<size_t>(u)].param_shard =
        flat_view(b.param_flat, {b.plan.shard_numel}, buckets_.owned_begin(u)).clone();
    b.param_flat.storage()->release();  // Note [Releasable storage]
  }
  publish();
}

OdcGatherer::~OdcGatherer() {
  link_->owner = nullptr;
  for (UnitState& s : units_) {
    try {
      if (s.pull) s.pull->wait();
    } catch (...) {  // a destructor must not throw; the error was the step's to report
    }
  }
  try {
    reap_pushes(true);
  } catch (...) {
  }
}

void OdcGatherer::track_gathered(int64_t delta) {
  gathered_bytes_ += delta;
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
}

// The owned shards into the parameter window, then the one barrier before anyone pulls them.
void OdcGatherer::publish() {
  for (int u = 0; u < units(); ++u) {
    LOOM_CHECK(!units_[static_cast<size_t>(u)].gathered,
               "parallel.odc: the parameters changed while unit ", u,
               " is gathered (inside a forward or backward)");
  }
  if (outside_reads_) params_->barrier();  // nobody still reads the old copy
  for (int u = 0; u < units(); ++u)
    params_->write_local(offsets_[static_cast<size_t>(u)],
                         units_[static_cast<size_t>(u)].param_shard);
  params_->barrier();
  stale_ = false;
  outside_reads_ = false;
  unpublished_finish_ = false;
}

void OdcGatherer::pull_unit(int unit, bool prefetch) {
  UnitState& s = units_.at(static_cast<size_t>(unit));
  if (s.gathered) return;
  const GradBucket& b = buckets_.bucket(unit);
  b.param_flat.storage()->materialize();
  track_gathered(static_cast<int64_t>(b.param_flat.nbytes()));
  // One get per owner, starting with the next rank (Note [ODC]: rotated order).
  const int S = params_->size(), r = params_->rank();
  const int64_t n = b.plan.shard_numel;
  std::vector<WorkPtr> gets;
  for (int k = 1; k <= S; ++k) {
    const int owner = (r + k) % S;
    gets.push_back(params_->get_async(owner, offsets_[static_cast<size_t>(unit)],
                                      flat_view(b.param_flat, {n}, owner * n)));
  }
  s.pull = join_works(std::move(gets));
  s.gathered = true;
  if (!in_step_) outside_reads_ = true;
  log_.log(prefetch ? DpEventKind::kPrefetch : DpEventKind::kGather, unit,
           "odc get " + params_->name());
}

void OdcGatherer::wait_unit(int unit) {
  UnitState& s = units_.at(static_cast<size_t>(unit));
  if (!s.pull) return;
  const auto t0 = std::chrono::steady_clock::now();
  s.pull->wait();
  log_.add_blocked(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  s.pull.reset();
}

void OdcGatherer::release_unit(int unit) {
  UnitState& s = units_.at(static_cast<size_t>(unit));
  if (!s.gathered) return;
  wait_unit(unit);  // the gets may still be writing into the buffer
  const Tensor& flat = buckets_.bucket(unit).param_flat;
  flat.storage()->release();
  s.gathered = false;
  track_gathered(-static_cast<int64_t>(flat.nbytes()));
  log_.log(DpEventKind::kRelease, unit, "");
}

bool OdcGatherer::acquire(int unit) {
  if (stale_) publish();  // acquire is collective (DataParallel::full_parameters)
  const bool was = units_.at(static_cast<size_t>(unit)).gathered;
  pull_unit(unit, false);
  wait_unit(unit);
  return was;
}

void OdcGatherer::before_forward(int unit) {
  LOOM_CHECK(unit >= 0 && unit < units(), "data_parallel: unit ", unit, " out of range (", units(),
             " units)");
  const bool outermost = std::none_of(units_.begin(), units_.end(),
                                      [](const UnitState& o) { return o.forward_uses > 0; });
  ++units_[static_cast<size_t>(unit)].forward_uses;
  pull_unit(unit, false);
  wait_unit(unit);
  log_.log(DpEventKind::kUnitForward, unit, "");
  // Prefetch the next unit while this one computes (not from a nested use: a tied head
  // entering the embeddings again must not pull the first block).
  if (outermost && unit + 1 < units()) pull_unit(unit + 1, true);
}

Tensor OdcGatherer::after_forward(int unit, const Tensor& out) {
  UnitState& s = units_.at(static_cast<size_t>(unit));
  LOOM_CHECK(s.forward_uses > 0, "data_parallel: after_forward(", unit, ") without before_forward");
  log_.log(DpEventKind::kUnitForwardEnd, unit, "");
  if (--s.forward_uses == 0) release_unit(unit);
  if (!autograd::grad_enabled() || !out.requires_grad()) return out;
  // An identity whose backward runs before the unit's own backward nodes (as in zero3.cpp).
  Tensor y = out.detach();
  std::shared_ptr<Link> link = link_;
  autograd::record_function("odc_unit_backward", {out}, {&y},
                            [link, unit](const std::vector<Tensor>& g) {
                              if (link->owner != nullptr) link->owner->before_backward(unit);
                              return std::vector<Tensor>{g[0]};
                            });
  return y;
}

void OdcGatherer::before_backward(int unit) {
  log_.log(DpEventKind::kUnitBackward, unit, "");
  reap_pushes(false);
  buckets_.attach_grad_views(unit);  // AccumulateGrad adds straight into the unit's buffer
  pull_unit(unit, false);
  wait_unit(unit);
  if (unit > 0) pull_unit(unit - 1, true);  // backward runs the units in reverse
}

void OdcGatherer::unit_gradients_ready(int unit, bool sync) {
  release_unit(unit);
  buckets_.recount(unit);  // the next micro-batch counts again
  if (options_.overlap) push_unit(unit, DpEventKind::kLaunch, sync);
}

// Each owner's piece of the unit gradient accumulated into its gradient window: into the one
// buffer, or (deterministic) into this rank's slot. No other rank takes part.
void OdcGatherer::push_unit(int unit, DpEventKind kind, bool sync) {
  reap_pushes(false);
  const GradBucket& b = buckets_.bucket(unit);
  const int S = grads_->size(), r = grads_->rank();
  const int64_t n = b.plan.shard_numel;
  const int64_t at =
      (options_.deterministic ? r * total_ : 0) + offsets_[static_cast<size_t>(unit)];
  const Tensor grad = buckets_.take_grad_buffer(unit);
  std::vector<WorkPtr> sends;
  for (int k = 1; k <= S; ++k) {
    const int owner = (r + k) % S;
    sends.push_back(grads_->accumulate_async(owner, at, flat_view(grad, {n}, owner * n)));
  }
  pushes_.push_back({join_works(std::move(sends)), grad});
  if (kind == DpEventKind::kLaunch && sync)
    log_.add_launched_early(static_cast<int64_t>(b.plan.bytes()));
  log_.log(kind, unit, "odc accumulate " + grads_->name());
}

void OdcGatherer::reap_pushes(bool wait_all) {
  while (!pushes_.empty() && (wait_all || pushes_.front().work->is_done())) {
    pushes_.front().work->wait();
    buckets_.grad_buffer_done(pushes_.front().grad_flat.nbytes());
    pushes_.erase(pushes_.begin());
  }
}

void OdcGatherer::start_step() {
  LOOM_CHECK(pushes_.empty(),
             "data_parallel: zero_grad() with gradient pushes in flight; call "
             "finish_gradient_sync() first");
  for (int u = 0; u < units(); ++u) {
    LOOM_CHECK(!buckets_.bucket(u).grad_flat.defined(), "data_parallel: zero_grad() with unit ", u,
               "'s gradient not yet pushed; call finish_gradient_sync() first");
  }
  // Publish what changed; or, when no step published since the last finish(), barrier anyway:
  // an owner may still be zeroing its gradient window for this step's pushes.
  if (stale_ || unpublished_finish_) publish();
  in_step_ = true;
  buckets_.clear_grads();
  buckets_.reset_counts();  // unit gradient buffers appear in each unit's backward
}

void OdcGatherer::finish() {
  for (int u = 0; u < units(); ++u) {
    // Overlap off, or a unit some of whose parameters got no gradient in the last backward.
    if (buckets_.bucket(u).grad_flat.defined()) push_unit(u, DpEventKind::kLateLaunch, true);
    release_unit(u);
  }
  reap_pushes(true);
  grads_->flush();
  grads_->barrier();  // the step's one synchronisation: every rank's pushes have landed
  in_step_ = false;
  outside_reads_ = false;
  const int S = grads_->size();
  const int slots = options_.deterministic ? S : 1;
  for (int u = 0; u < units(); ++u) {
    grads_->reduce_local(offsets_[static_cast<size_t>(u)], total_, slots, static_cast<double>(S),
                         buckets_.bucket(u).grad_shard);
  }
  // Nobody pushes again before the next publication's barrier (start_step makes sure of one).
  grads_->zero_local(0, grads_->numel());
  unpublished_finish_ = true;
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

int64_t OdcGatherer::window_bytes() const {
  const int64_t e = static_cast<int64_t>(dtype_size(params_->dtype()));
  return (params_->numel() + grads_->numel()) * e;
}

std::string OdcGatherer::describe() const {
  return std::string("odc") + (options_.deterministic ? " (deterministic)" : "") + " over " +
         params_->name().substr(params_->name().rfind(' ') + 1);
}

}  // namespace loom::parallel::odc
