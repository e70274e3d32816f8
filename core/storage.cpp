// core/storage.cpp — allocation and release of a Storage through its device's allocator.
#include "core/storage.h"

namespace loom {

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = allocator_for(device.type).allocate(bytes, device.index);
}

Storage::~Storage() { allocator_for(device_.type).deallocate(data_, bytes_, device_.index); }

}  // namespace loom
