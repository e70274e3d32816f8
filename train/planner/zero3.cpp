// train/planner/zero3.cpp — ZeRO-3's units on the byte counter (see train/planner/zero3.h, Note
// [ZeRO-3 memory]).
#include "train/planner/zero3.h"

#include <algorithm>
#include <utility>

namespace loom::planner {

Zero3Units::Zero3Units(ByteTimeline& tl, std::vector<int64_t> units, int64_t shards, int64_t e,
                       bool late_reductions, bool partials)
    : tl_(tl),
      units_(std::move(units)),
      shards_(shards),
      e_(e),
      late_(late_reductions),
      partials_(partials),
      gathered_(units_.size(), 0),
      grad_(units_.size(), 0),
      uses_(units_.size(), 0),
      shard_written_(units_.size(), false) {}

void Zero3Units::gather(int unit) {
  ByteTimeline::Id& g = gathered_.at(static_cast<size_t>(unit));
  if (!g) g = tl_.alloc(bytes(unit));
}

void Zero3Units::release(int unit) {
  ByteTimeline::Id& g = gathered_.at(static_cast<size_t>(unit));
  if (g) tl_.free(g);
  g = 0;
}

void Zero3Units::reap(bool all) {
  for (auto it = reduces_.begin(); it != reduces_.end();) {
    if (all || !late_ || it->sent_after > 0) {
      tl_.free(it->grad);
      if (it->partial) tl_.free(it->partial);
      it = reduces_.erase(it);
    } else {
      ++it;
    }
  }
}

void Zero3Units::before_forward(int unit) {
  const bool outermost = std::all_of(uses_.begin(), uses_.end(), [](int n) { return n == 0; });
  ++uses_.at(static_cast<size_t>(unit));
  gather(unit);
  if (outermost && unit + 1 < static_cast<int>(units_.size())) gather(unit + 1);
}

void Zero3Units::after_forward(int unit) {
  if (--uses_.at(static_cast<size_t>(unit)) == 0) release(unit);
}

void Zero3Units::before_backward(int unit) {
  reap(false);
  ByteTimeline::Id& g = grad_.at(static_cast<size_t>(unit));
  if (!g) g = tl_.alloc(bytes(unit));  // attach_grad_views
  gather(unit);
  if (unit > 0) gather(unit - 1);
}

void Zero3Units::gradients_ready(int unit) {
  release(unit);
  reap(false);  // send_gradient reaps first
  Reduce r;
  if (partials_ && shard_written_.at(static_cast<size_t>(unit)))
    r.partial = tl_.alloc(bytes(unit) / shards_);
  r.grad = std::exchange(grad_.at(static_cast<size_t>(unit)), 0);
  for (Reduce& o : reduces_) ++o.sent_after;
  reduces_.push_back(r);
  shard_written_.at(static_cast<size_t>(unit)) = true;
}

void Zero3Units::finish() {
  for (size_t u = 0; u < units_.size(); ++u) {
    release(static_cast<int>(u));
    if (grad_[u]) tl_.free(std::exchange(grad_[u], 0));  // a unit that got no gradient
  }
  reap(true);
  std::fill(shard_written_.begin(), shard_written_.end(), false);
}

void StageUnitEvents::before_forward(int unit) {
  for (int b : of(unit)) inner_.before_forward(b);
}

void StageUnitEvents::after_forward(int unit) {  // innermost first
  for (auto it = of(unit).rbegin(); it != of(unit).rend(); ++it) inner_.after_forward(*it);
}

void StageUnitEvents::before_backward(int unit) {  // the outermost identity runs first
  for (int b : of(unit)) inner_.before_backward(b);
}

void StageUnitEvents::gradients_ready(int unit) {
  for (int b : of(unit)) inner_.gradients_ready(b);
}

}  // namespace loom::planner
