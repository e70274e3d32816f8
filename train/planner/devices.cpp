// train/planner/devices.cpp — the device table and the fit of a plan (see
// train/planner/devices.h).
#include "train/planner/devices.h"

#include <unistd.h>

#include <iomanip>
#include <sstream>

#include "core/error.h"

namespace loom::planner {

const std::vector<DeviceSpec>& device_table() {
  // Networks: DGX A100 has 8 × 200 Gb/s HDR InfiniBand, DGX H100 / H200 8 × 400 Gb/s NDR.
  static const std::vector<DeviceSpec> table = {
      {"a100", "NVIDIA A100 (SXM, 80 GB HBM2e)", int64_t{81920} << 20, 312e12, 2.039e12, 600e9,
       25e9, 8, "NVIDIA A100-SXM4-80GB", ""},
      {"h100", "NVIDIA H100 (SXM, 80 GB HBM3)", int64_t{81559} << 20, 989e12, 3.35e12, 900e9, 50e9,
       8, "NVIDIA H100 80GB HBM3", ""},
      {"h200", "NVIDIA H200 (SXM, 141 GB HBM3e)", int64_t{143771} << 20, 989e12, 4.8e12, 900e9,
       50e9, 8, "NVIDIA H200",
       "one measured 2026-12-04 (docs/performance.md): 143,771 MiB, an 8192^3 bf16 GEMM at 789.4 "
       "TFLOP/s (80 % of the sheet's rate), a device copy at 4,251 GB/s (89 %); NVLink and the "
       "network not measured (one GPU)"},
  };
  return table;
}

// This machine's memory as one device (`--device cpu`: the CPU test bed's ranks share it).
const DeviceSpec& host_device() {
  static const DeviceSpec host = [] {
    DeviceSpec d;
    d.name = "cpu";
    d.model = "this machine's memory";
    d.memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
    d.checked = "this machine";
    return d;
  }();
  return host;
}

const DeviceSpec& find_device(const std::string& name) {
  if (name == "cpu") return host_device();
  std::string known;
  for (const DeviceSpec& d : device_table()) {
    if (d.name == name) return d;
    known += (known.empty() ? "" : ", ") + d.name;
  }
  throw ConfigError("--device: unknown device '" + name + "' (known: " + known + ", cpu)");
}

bool fits(int64_t peak_bytes, const DeviceSpec& device) {
  return peak_bytes + kCublasLtWorkspaceBytes <= device.memory_bytes;
}

std::string format_fit(int64_t peak_bytes, const DeviceSpec& device) {
  const double gib = static_cast<double>(int64_t{1} << 30);
  const int64_t need = peak_bytes + kCublasLtWorkspaceBytes;
  std::ostringstream o;
  o << std::fixed << std::setprecision(2);
  if (fits(peak_bytes, device)) {
    o << "  fits on " << device.name << ": step peak + cuBLASLt workspace " << need / gib
      << " GiB of " << device.memory_bytes / gib << " GiB (" << std::setprecision(1)
      << 100.0 * static_cast<double>(device.memory_bytes - need) /
             static_cast<double>(device.memory_bytes)
      << " % left for the CUDA context and the libraries' own buffers, which the plan does not "
         "count)\n";
  } else {
    o << "  does NOT fit on " << device.name << ": step peak + cuBLASLt workspace " << need / gib
      << " GiB, " << (need - device.memory_bytes) / gib << " GiB more than its "
      << device.memory_bytes / gib << " GiB (before the CUDA context and the libraries' own "
      << "buffers, which the plan does not count)\n";
  }
  return o.str();
}

}  // namespace loom::planner
