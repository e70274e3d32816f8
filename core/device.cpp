// core/device.cpp — device queries answered through the kernel registry (the core itself
// has no CUDA symbol).
#include "core/device.h"

#include "kernels/copy.h"

namespace loom {

int device_count(DeviceType type) {
  if (type == DeviceType::kCpu) return 1;
  if (!kernels::Registry::instance().has(kernels::device_count_k::kName, type)) return 0;
  return kernels::find_kernel<kernels::device_count_k>(type)();
}

void set_current_device(Device device) {
  if (device.is_cpu()) return;
  kernels::find_kernel<kernels::set_current_device_k>(device.type)(device.index);
}

}  // namespace loom
