// parallel/dp/unit_gatherer.cpp — UnitGatherer (see parallel/dp/unit_gatherer.h; Note [ZeRO-3]
// in parallel/dp/data_parallel.h): the unit-hook schedule both ZeRO-3 gatherers share — gathers
// just in time with prefetch, nested uses of a tied unit, the unit-backward identity, releases
// and the gathered-bytes accounting. What moves the bytes is the scheme's (zero3.cpp,
// parallel/odc/odc_gatherer.cpp).
#include "parallel/dp/unit_gatherer.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/autograd.h"

namespace loom::parallel::dp {

UnitGatherer::UnitGatherer(GradBuckets& buckets, DpStepLog& log, bool overlap,
                           std::string backward_node)
    : buckets_(buckets),
      log_(log),
      overlap_(overlap),
      backward_node_(std::move(backward_node)),
      units_(static_cast<size_t>(buckets.size())),
      link_(std::make_shared<Link>()) {
  link_->owner = this;
}

UnitGatherer::~UnitGatherer() { detach(); }

void UnitGatherer::detach() noexcept {
  link_->owner = nullptr;
  for (UnitState& s : units_) {
    try {
      if (s.fetch) s.fetch->wait();
    } catch (...) {  // a destructor must not throw; the error was the step's to report
    }
    s.fetch.reset();
  }
}

void UnitGatherer::take_owned_shards() {
  for (int u = 0; u < units(); ++u) {
    GradBucket& b = buckets_.bucket(u);
    units_[static_cast<size_t>(u)].param_shard =
        flat_view(b.param_flat, {b.plan.shard_numel}, buckets_.owned_begin(u)).clone();
    b.param_flat.storage()->release();  // Note [Releasable storage]
  }
}

void UnitGatherer::track_gathered(int64_t delta) {
  gathered_bytes_ += delta;
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
}

void UnitGatherer::gather_unit(int unit, bool prefetch) {
  UnitState& s = units_.at(static_cast<size_t>(unit));
  if (s.gathered) return;
  const Tensor& flat = buckets_.bucket(unit).param_flat;
  flat.storage()->materialize();
  track_gathered(static_cast<int64_t>(flat.nbytes()));
  s.fetch = fetch(unit, flat);
  s.gathered = true;
  log_.log(prefetch ? DpEventKind::kPrefetch : DpEventKind::kGather, unit, fetch_op());
}

void UnitGatherer::wait_unit(int unit) {
  UnitState& s = units_.at(static_cast<size_t>(unit));
  if (!s.fetch) return;
  const auto t0 = std::chrono::steady_clock::now();
  s.fetch->wait();
  log_.add_blocked(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  s.fetch.reset();
}

void UnitGatherer::release_unit(int unit) {
  UnitState& s = units_.at(static_cast<size_t>(unit));
  if (!s.gathered) return;
  wait_unit(unit);  // the transfer may still be writing into the buffer
  const Tensor& flat = buckets_.bucket(unit).param_flat;
  flat.storage()->release();
  s.gathered = false;
  track_gathered(-static_cast<int64_t>(flat.nbytes()));
  log_.log(DpEventKind::kRelease, unit, "");
}

bool UnitGatherer::acquire(int unit) {
  before_acquire();
  const bool was = units_.at(static_cast<size_t>(unit)).gathered;
  gather_unit(unit, false);
  wait_unit(unit);
  return was;
}

void UnitGatherer::before_forward(int unit) {
  LOOM_CHECK(unit >= 0 && unit < units(), "data_parallel: unit ", unit, " out of range (", units(),
             " units)");
  const bool outermost = std::none_of(units_.begin(), units_.end(),
                                      [](const UnitState& o) { return o.forward_uses > 0; });
  ++units_[static_cast<size_t>(unit)].forward_uses;
  gather_unit(unit, false);
  wait_unit(unit);
  log_.log(DpEventKind::kUnitForward, unit, "");
  // Prefetch the next unit while this one computes (not from a nested use: a tied head
  // entering the embeddings again must not gather the first block).
  if (outermost && unit + 1 < units()) gather_unit(unit + 1, true);
}

Tensor UnitGatherer::after_forward(int unit, const Tensor& out) {
  UnitState& s = units_.at(static_cast<size_t>(unit));
  LOOM_CHECK(s.forward_uses > 0, "data_parallel: after_forward(", unit, ") without before_forward");
  log_.log(DpEventKind::kUnitForwardEnd, unit, "");
  if (--s.forward_uses == 0) release_unit(unit);
  if (!autograd::grad_enabled() || !out.requires_grad()) return out;
  // An identity whose backward runs before the unit's own backward nodes (it is newer than
  // all of them, and they depend on its output gradient).
  Tensor y = out.detach();
  std::shared_ptr<Link> link = link_;
  autograd::record_function(backward_node_, {out}, {&y},
                            [link, unit](const std::vector<Tensor>& g) {
                              if (link->owner != nullptr) link->owner->before_backward(unit);
                              return std::vector<Tensor>{g[0]};
                            });
  return y;
}

void UnitGatherer::before_backward(int unit) {
  log_.log(DpEventKind::kUnitBackward, unit, "");
  backward_begins();
  buckets_.attach_grad_views(unit);  // AccumulateGrad adds straight into the unit's buffer
  gather_unit(unit, false);
  wait_unit(unit);
  if (unit > 0) gather_unit(unit - 1, true);  // backward runs the units in reverse
}

void UnitGatherer::unit_gradients_ready(int unit, bool sync) {
  // Every node reading these parameters has run (each delivers a gradient to them), so the
  // gathered copy can go now.
  release_unit(unit);
  buckets_.recount(unit);  // the next micro-batch counts again
  if (overlap_) send_gradient(unit, DpEventKind::kLaunch, sync);
  // Overlap off: the full unit gradient stays and is sent in finish().
}

void UnitGatherer::send_remaining_and_release() {
  for (int u = 0; u < units(); ++u) {
    // Overlap off, or a unit some of whose parameters got no gradient in the last backward.
    if (buckets_.bucket(u).grad_flat.defined()) send_gradient(u, DpEventKind::kLateLaunch, true);
    release_unit(u);
  }
}

void UnitGatherer::replica_hop(GradSync& sync) {
  if (!sync.has_second_hop()) return;
  std::vector<WorkPtr> works;
  for (int u = 0; u < units(); ++u) {
    works.push_back(sync.second_hop(buckets_.bucket(u).grad_shard));
    log_.log(DpEventKind::kReplicaLaunch, u, sync.second_op());
  }
  for (WorkPtr& w : works) w->wait();
}

}  // namespace loom::parallel::dp
