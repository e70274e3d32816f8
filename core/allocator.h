// core/allocator.h — the one allocator interface per device type, with byte statistics.
// The CPU allocator is built in (64-byte aligned; large blocks cached, Note [Block cache]); the
// CUDA build registers its own from kernels/cuda/. Statistics (current and peak bytes) are what
// memory figures and ZeRO tests read.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace loom {

struct AllocatorStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t num_allocs = 0;  // allocations made since start (not frees)
  // Bytes a caching device allocator holds from the device (live and cached blocks, all
  // devices): it grows only when the allocator calls cudaMalloc, so a steady-state training step
  // leaves it unchanged. 0 for allocators that do not report it (the CPU's).
  int64_t reserved_bytes = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, int device_index) = 0;
  virtual void deallocate(void* ptr, size_t bytes, int device_index) = 0;
  virtual AllocatorStats stats() const = 0;
  // Restarts peak tracking at the current number of bytes.
  virtual void reset_peak() = 0;
  // Returns cached free blocks to the system (caching allocators; a no-op otherwise).
  virtual void release_cached() {}
};

// Counts current/peak bytes; shared by the device allocators.
class ByteCounter {
 public:
  void add(int64_t bytes);
  void sub(int64_t bytes);
  AllocatorStats stats() const;
  void reset_peak();

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocs_{0};
};

// Returns the allocator for a device type; throws naming the device if the build has none.
Allocator& allocator_for(DeviceType type);

// Used once per device type at static-initialisation time (see kernels/cuda/cuda_allocator.cu).
// Note [Process-wide registries]: the allocator and kernel tables are the only process-wide
// objects in Loom. They are filled before main() runs and are read-only afterwards.
void register_allocator(DeviceType type, Allocator* allocator);

}  // namespace loom
