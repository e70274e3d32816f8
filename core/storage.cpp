// core/storage.cpp — allocation and release of a Storage through its device's allocator.
#include "core/storage.h"

namespace loom {

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = allocator_for(device.type).allocate(bytes, device.index);
}

Storage::~Storage() { release(); }

void Storage::release() {
  if (released_) return;
  allocator_for(device_.type).deallocate(data_, bytes_, device_.index);
  data_ = nullptr;
  released_ = true;
}

void Storage::materialize() {
  if (!released_) return;
  data_ = allocator_for(device_.type).allocate(bytes_, device_.index);
  released_ = false;
}

}  // namespace loom
