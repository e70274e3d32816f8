// train/readback.cpp — Readback (train/readback.h): the pinned slots and the asynchronous copies
// (kernels/host_staging.h) behind them.
#include "train/readback.h"

#include <utility>

namespace loom {

Readback::~Readback() {
  if (pinned_ != nullptr) kernels::find_kernel<kernels::pinned_host_free_k>(type_)(pinned_);
}

Readback::Pending Readback::start(const Tensor& values) {
  LOOM_CHECK(
      values.dtype() == DType::kF64 && values.is_contiguous() && values.numel() <= kSlotValues,
      "readback: expected a contiguous f64 tensor of at most ", kSlotValues, " elements");
  Pending p;
  if (values.device().is_cpu()) {
    p.values_ = values.to_vector();
    p.ready_at_ = std::chrono::steady_clock::now();
    return p;
  }
  if (pinned_ == nullptr) {
    type_ = values.device().type;
    pinned_ = static_cast<double*>(kernels::find_kernel<kernels::pinned_host_alloc_k>(type_)(
        sizeof(double) * kSlots * kSlotValues));
  }
  LOOM_CHECK(values.device().type == type_, "readback: reads from ",
             device_type_name(values.device().type), " after ", device_type_name(type_));
  int slot = 0;
  while (slot < kSlots && busy_[static_cast<size_t>(slot)]) ++slot;
  LOOM_CHECK(slot < kSlots, "readback: ", kSlots, " reads are already pending");
  p.copy_ = kernels::find_kernel<kernels::copy_device_to_pinned_async_k>(type_)(
      values, pinned_ + slot * kSlotValues);
  busy_[static_cast<size_t>(slot)] = true;
  p.owner_ = this;
  p.slot_ = slot;
  p.count_ = values.numel();
  return p;
}

const std::vector<double>& Readback::Pending::get() {
  if (owner_ != nullptr) {
    copy_->wait();
    ready_at_ = std::chrono::steady_clock::now();
    const double* src = owner_->pinned_ + slot_ * kSlotValues;
    values_.assign(src, src + count_);
    release();
  }
  return values_;
}

void Readback::Pending::release() noexcept {
  if (owner_ == nullptr) return;
  // The slot may be reused only once the copy into it is done. A device error here (destructors
  // and moves cannot throw) is sticky and reported by the device's next call.
  try {
    if (copy_) copy_->wait();
  } catch (...) {
  }
  owner_->busy_[static_cast<size_t>(slot_)] = false;
  owner_ = nullptr;
  copy_.reset();
}

Readback::Pending::Pending(Pending&& o) noexcept
    : owner_(std::exchange(o.owner_, nullptr)),
      slot_(o.slot_),
      count_(o.count_),
      copy_(std::move(o.copy_)),
      values_(std::move(o.values_)),
      ready_at_(o.ready_at_) {}

Readback::Pending& Readback::Pending::operator=(Pending&& o) noexcept {
  if (this != &o) {
    release();
    owner_ = std::exchange(o.owner_, nullptr);
    slot_ = o.slot_;
    count_ = o.count_;
    copy_ = std::move(o.copy_);
    values_ = std::move(o.values_);
    ready_at_ = o.ready_at_;
  }
  return *this;
}

Readback::Pending::~Pending() { release(); }

}  // namespace loom
