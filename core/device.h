// core/device.h — where a tensor lives: a device type and an index. Plain values, no state.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

enum class DeviceType : int8_t { kCpu, kCuda };
constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  std::string str() const;

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceType::kCuda, index}; }
};

const char* device_type_name(DeviceType t);

// Devices of this type visible to the process: 1 for the CPU; 0 when the build has no backend
// for the type or the machine has no such device.
int device_count(DeviceType type);
// Makes `device` the calling thread's current device of its type (nothing for the CPU); the
// process picks its GPU once with it (train/trainer.cpp, parallel/parallel_context.cpp).
void set_current_device(Device device);

}  // namespace loom
