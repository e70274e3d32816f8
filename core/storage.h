// core/storage.h — a device buffer owned through its allocator. Tensors share Storage by
// shared_ptr; views point into the same Storage with their own shape/strides/offset.
#pragma once

#include <cstddef>
#include <memory>

#include "core/allocator.h"
#include "core/device.h"

namespace loom {

class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // Note [Releasable storage]: ZeRO-3 (parallel/dp) frees a gathered parameter buffer between
  // uses while tensors saved by the autograd graph still point at this Storage, and allocates it
  // again before they are read; views keep their Storage, so they see the new buffer. release()
  // returns the buffer to the allocator (data() is null until materialize()); materialize()
  // allocates a buffer of the same size, contents undefined. Both are no-ops when already so.
  void release();
  void materialize();
  bool released() const { return released_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  bool released_ = false;
};

}  // namespace loom
