// tests/train/plan_devices_test.cpp — the planner's device table and fit (train/planner/
// devices.h): names resolve or fail naming the option and the known devices; a plan fits exactly
// when its peak and the cuBLASLt workspace are within the device's memory, and says so.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "train/planner/devices.h"

namespace loom::planner {
namespace {

TEST(PlanDevices, KnownNamesResolveAndOthersAreAConfigError) {
  EXPECT_EQ(find_device("h200").memory_bytes, int64_t{143771} << 20);
  EXPECT_GT(find_device("h100").bf16_flops, find_device("a100").bf16_flops);
  try {
    find_device("v100");
    FAIL() << "an unknown device must be refused";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--device"), std::string::npos) << what;
    EXPECT_NE(what.find("'v100'"), std::string::npos) << what;
    EXPECT_NE(what.find("a100, h100, h200"), std::string::npos) << what;
  }
}

TEST(PlanDevices, FitsOnlyWithinTheDevicesMemoryAndSaysWhatItLeavesOut) {
  const DeviceSpec& h100 = find_device("h100");
  int64_t peak = h100.memory_bytes - kCublasLtWorkspaceBytes;
  EXPECT_TRUE(fits(peak, h100));
  EXPECT_EQ(format_fit(peak, h100).rfind("  fits on h100", 0), 0U) << format_fit(peak, h100);
  peak += 1;
  EXPECT_FALSE(fits(peak, h100));
  const std::string text = format_fit(peak, h100);
  EXPECT_EQ(text.rfind("  does NOT fit on h100", 0), 0U) << text;
  EXPECT_NE(text.find("CUDA context"), std::string::npos) << text;
}

TEST(PlanDevices, OnlyTheMeasuredDeviceSaysItWasChecked) {
  for (const DeviceSpec& d : device_table()) {
    EXPECT_EQ(d.checked.empty(), d.name != "h200") << d.name;
    EXPECT_GT(d.memory_bytes, 0) << d.name;
    EXPECT_GT(d.hbm_bytes_per_s, 0) << d.name;
  }
}

}  // namespace
}  // namespace loom::planner
