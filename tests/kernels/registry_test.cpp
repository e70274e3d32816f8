// tests/kernels/registry_test.cpp — every declared kernel has a CPU implementation; dispatch
// errors name the op and the device.
#include "kernels/registry.h"

#include <gtest/gtest.h>

#include <set>

#include "kernels/kernel_list.h"

namespace loom {
namespace {

std::vector<std::string> all_declared() {
#define LOOM_NAME(k) #k,
  return {LOOM_FOR_EACH_KERNEL(LOOM_NAME)};
#undef LOOM_NAME
}

std::vector<std::string> device_only() {
#define LOOM_NAME(k) #k,
  return {LOOM_FOR_EACH_DEVICE_ONLY_KERNEL(LOOM_NAME)};
#undef LOOM_NAME
}

TEST(Registry, EveryKernelHasACpuImplementation) {
  const auto& reg = kernels::Registry::instance();
  for (const std::string& name : all_declared()) {
    EXPECT_TRUE(reg.has(name, DeviceType::kCpu)) << "kernel " << name << " has no CPU kernel";
  }
}

TEST(Registry, EveryRegisteredKernelIsListed) {
  std::set<std::string> listed;
  for (const auto& n : all_declared()) listed.insert(n);
  for (const auto& n : device_only()) listed.insert(n);
  for (DeviceType d : {DeviceType::kCpu, DeviceType::kCuda}) {
    for (const std::string& name : kernels::Registry::instance().names(d)) {
      EXPECT_TRUE(listed.count(name)) << name << " is registered but not in kernels/kernel_list.h";
    }
  }
}

TEST(Registry, MissNamesOpAndDevice) {
  try {
    kernels::Registry::instance().find("no_such_op", DeviceType::kCuda, typeid(void()));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_op: no kernel for cuda"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom
