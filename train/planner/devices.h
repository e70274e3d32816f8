// train/planner/devices.h — the GPUs a plan can be checked against: memory, dense bf16 rate,
// HBM and NVLink bandwidth, from their data sheets, each marked with what was measured on one
// (docs/planning.md, "Devices"), and whether a memory plan fits on one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::planner {

struct DeviceSpec {
  std::string name;             // "h200": the --device name
  std::string model;            // "NVIDIA H200 (SXM, 141 GB HBM3e)"
  int64_t memory_bytes = 0;     // what the driver reports as the device's total
  double bf16_flops = 0;        // dense, per second
  double hbm_bytes_per_s = 0;   // read + write
  double link_bytes_per_s = 0;  // NVLink, all links, both directions
  // Between hosts, per GPU and direction: the network of the vendor's 8-GPU system (one NIC per
  // GPU), and how many GPUs one host has.
  double network_bytes_per_s = 0;
  int64_t gpus_per_host = 8;
  std::string cuda_name;  // what the driver calls it (cudaDeviceProp::name): the calibration's key
  std::string checked;    // what was measured on one, and when; empty: data sheet only
};

// The table, in the order `train --plan --device` lists them.
const std::vector<DeviceSpec>& device_table();
// The entry named `name` ("cpu": this machine's memory, for the CPU test bed); ConfigError
// naming `--device` and the known names otherwise.
const DeviceSpec& find_device(const std::string& name);

// Bytes of the device that Loom's allocator does not count but a step needs: cuBLASLt's
// workspace (kernels/cuda/cublaslt_handle.cuh, one per device).
constexpr int64_t kCublasLtWorkspaceBytes = int64_t{32} << 20;

// "fits on h200: …" or "does NOT fit on h200: …" for a rank's step peak (MemoryPlan::peak_bytes)
// plus the workspace against the device's memory, and what is not counted (the CUDA context,
// cuDNN's and NCCL's own buffers).
std::string format_fit(int64_t peak_bytes, const DeviceSpec& device);
bool fits(int64_t peak_bytes, const DeviceSpec& device);

}  // namespace loom::planner
