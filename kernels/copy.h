// kernels/copy.h — data movement kernels: strided copy with dtype conversion, fill, and the
// host↔device transfers that a GPU backend registers.
#pragma once

#include "kernels/registry.h"

// dst[i] = convert(src[i]) for every logical index; same shape, any strides, any dtypes.
LOOM_DECLARE_KERNEL(copy, void(const loom::Tensor& src, loom::Tensor& dst));
// dst[i] = value for every logical index (any strides).
LOOM_DECLARE_KERNEL(fill, void(loom::Tensor& dst, double value));
// Contiguous, same dtype and shape; registered for the device type that is not the host. The
// download is complete when it returns. The upload may return before the device has the data
// (CUDA: Note [Asynchronous uploads] in kernels/cuda/copy.cu); src_host may be reused or freed
// at once, and work issued afterwards by the same thread, and communication, sees the data.
LOOM_DECLARE_KERNEL(copy_device_to_host, void(const loom::Tensor& src, loom::Tensor& dst_host));
LOOM_DECLARE_KERNEL(copy_host_to_device, void(const loom::Tensor& src_host, loom::Tensor& dst));
// Number of devices of the registering type visible to this process (0 when none).
LOOM_DECLARE_KERNEL(device_count, int());
// The product name of device `index` of the registering type ("NVIDIA H200"), for keys of
// per-device measurements (train/planner/calibrate.h).
LOOM_DECLARE_KERNEL(device_name, std::string(int index));
// Makes device `index` of the registering type current for the calling thread (CUDA:
// cudaSetDevice), so that work issued without a device guard, and every guard's restore, stay
// on the rank's own GPU instead of creating a context on device 0.
LOOM_DECLARE_KERNEL(set_current_device, void(int index));
