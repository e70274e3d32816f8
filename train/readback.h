// train/readback.h — Readback: a step's few numbers (its loss, its gradients' sum of squares)
// copied from the device into pinned host memory behind the step's work, and read only when the
// trainer reports the step, so the host never waits for the device inside a step (Note [Device
// step] in train/train_step.cpp). CPU tensors are read at once. One Readback per trainer; it
// owns a small pinned buffer of kSlots slots, each held by one pending read until that read is
// destroyed.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "kernels/host_staging.h"

namespace loom {

class Readback {
 public:
  static constexpr int kSlots = 4;           // reads that may be pending at once
  static constexpr int64_t kSlotValues = 8;  // f64 values per read, at most

  // One started read; get() waits for it (the first time) and returns the values.
  class Pending {
   public:
    Pending() = default;
    Pending(Pending&& o) noexcept;
    Pending& operator=(Pending&& o) noexcept;
    Pending(const Pending&) = delete;
    Pending& operator=(const Pending&) = delete;
    ~Pending();
    const std::vector<double>& get();
    // When the values were known to be on the host: at start() for CPU tensors, when get()'s wait
    // returned for device tensors (the device's progress as the host sees it). Valid after get().
    std::chrono::steady_clock::time_point ready_at() const { return ready_at_; }

   private:
    friend class Readback;
    void release() noexcept;
    Readback* owner_ = nullptr;  // set while a device slot is held
    int slot_ = -1;
    int64_t count_ = 0;
    std::unique_ptr<kernels::HostCopy> copy_;
    std::vector<double> values_;
    std::chrono::steady_clock::time_point ready_at_{};
  };

  Readback() = default;
  Readback(const Readback&) = delete;
  Readback& operator=(const Readback&) = delete;
  ~Readback();

  // Starts reading `values`: a contiguous f64 tensor of at most kSlotValues elements, on any
  // device. Throws when kSlots reads are already pending (a caller's bug).
  Pending start(const Tensor& values);

 private:
  DeviceType type_ = DeviceType::kCpu;  // of the pinned buffer's allocator
  double* pinned_ = nullptr;            // kSlots × kSlotValues doubles, allocated at first use
  std::array<bool, kSlots> busy_{};
};

}  // namespace loom
