// parallel/odc/odc_gatherer.cpp — OdcGatherer (see parallel/odc/odc_gatherer.h, Note [ODC]): the
// windows' layout, pulls in rotated owner order, pushes from the gradient hooks, the step's one
// synchronisation and the publication of updated shards. The hook schedule (just-in-time gathers
// with prefetch, nested uses of a tied unit, the unit-backward identity) is dp::UnitGatherer's
// (parallel/dp/unit_gatherer.cpp), shared with Zero3Gatherer; only the transfers differ here.
#include "parallel/odc/odc_gatherer.h"

#include <utility>
#include <vector>

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
  return shard.one_sided_window(numel, units_dtype(buckets), std::move(name), timeout_s);
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
    : UnitGatherer(buckets, log, options.overlap, "odc_unit_backward"),
      params_(std::move(params)),
      grads_(std::move(grads)),
      sync_(sync),
      options_(options) {
  init();
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
  take_owned_shards();
  publish();
}

OdcGatherer::~OdcGatherer() {
  detach();  // the pulls read the parameter window: wait for them while it lives
  try {
    reap_pushes(true);
  } catch (...) {  // a destructor must not throw; the error was the step's to report
  }
}

// The owned shards into the parameter window, then the one barrier before anyone pulls them.
void OdcGatherer::publish() {
  for (int u = 0; u < units(); ++u) {
    LOOM_CHECK(!gathered(u), "parallel.odc: the parameters changed while unit ", u,
               " is gathered (inside a forward or backward)");
  }
  if (outside_reads_) params_->barrier();  // nobody still reads the old copy
  for (int u = 0; u < units(); ++u)
    params_->write_local(offsets_[static_cast<size_t>(u)], owned_values(u));
  params_->barrier();
  stale_ = false;
  outside_reads_ = false;
  unpublished_finish_ = false;
}

// One get per owner into `flat`, starting with the next rank (Note [ODC]: rotated order).
WorkPtr OdcGatherer::fetch(int unit, const Tensor& flat) {
  const int S = params_->size(), r = params_->rank();
  const int64_t n = buckets_.bucket(unit).plan.shard_numel;
  std::vector<WorkPtr> gets;
  for (int k = 1; k <= S; ++k) {
    const int owner = (r + k) % S;
    gets.push_back(params_->get_async(owner, offsets_[static_cast<size_t>(unit)],
                                      flat_view(flat, {n}, owner * n)));
  }
  if (!in_step_) outside_reads_ = true;
  return join_works(std::move(gets));
}

// Each owner's piece of the unit gradient accumulated into its gradient window: into the one
// buffer, or (deterministic) into this rank's slot. No other rank takes part.
void OdcGatherer::send_gradient(int unit, DpEventKind kind, bool sync) {
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
  send_remaining_and_release();
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
  replica_hop(sync_);  // MiCS: across replicas, in unit order
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

dp::GathererFactory gatherer_factory(const OdcOptions& options) {
  return [options](dp::GradBuckets& buckets, Communicator& shard, dp::GradSync& sync,
                   DpStepLog& log, bool overlap) -> std::unique_ptr<dp::UnitGatherer> {
    OdcOptions o = options;
    o.overlap = overlap;
    return std::make_unique<OdcGatherer>(buckets, shard, sync, log, o);
  };
}

}  // namespace loom::parallel::odc
