// kernels/cuda/cuda_device.cuh — CudaDeviceGuard: makes a device current for a scope and
// restores the previous one. Every CUDA launcher that touches a tensor's memory opens one on
// the tensor's device index. Holds no state beyond the scope. Also: the compute stream, the grid
// size of a grid-stride loop, and the per-block launch limits every kernel is held to (Launch
// resources in docs/cuda.md).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"

namespace loom::kernels::cuda {

class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int index) {
    LOOM_CHECK(index >= 0, "cuda: bad device index ", index);
    CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index) CUDA_CHECK(cudaSetDevice(index));
  }
  ~CudaDeviceGuard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// The stream every compute kernel and cuBLASLt call of this thread is issued on. It is CUDA's
// per-thread default stream: a real stream (work on it runs in order) that is not the legacy
// stream, so communication streams created with cudaStreamNonBlocking run beside it and are
// ordered against it only by events (Note [Streams] in docs/cuda.md). It is not a Loom-owned
// object, so there is nothing to create or destroy.
inline cudaStream_t compute_stream() { return cudaStreamPerThread; }

// Launch limits of the architectures built (sm_80, sm_90). Every kernel carries
// __launch_bounds__(its largest block), so ptxas fits its registers to that block; kernels that
// take more than kDefaultDynamicSmem bytes of dynamic shared memory opt in with
// cudaFuncSetAttribute(…, cudaFuncAttributeMaxDynamicSharedMemorySize, …) before each launch, and
// a size fixed at compile time is static_assert-ed against kMaxOptinSmem (sizes found at run time
// are bounded by the device's own opt-in limit, row_io.cuh).
constexpr size_t kDefaultDynamicSmem = 48 * 1024;  // usable without the opt-in
constexpr size_t kMaxOptinSmem = 163 * 1024;  // per block after the opt-in: sm_80 (sm_90: 227 KiB)

// Blocks and threads for a grid-stride loop over n elements (n > 0).
inline unsigned grid_for(int64_t n, unsigned threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  constexpr int64_t kMaxBlocks = 65535 * 8;  // enough to fill any current GPU; the loop strides
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

}  // namespace loom::kernels::cuda
