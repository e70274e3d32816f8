// kernels/cuda/host_staging.cu — the CUDA side of kernels/host_staging.h: cudaMallocHost /
// cudaFreeHost and blocking cudaMemcpy between a device tensor and a pinned host buffer. Holds
// no buffers itself (callers own and cache them) and launches no kernels.
//
// The copies use cudaMemcpy, i.e. the legacy default stream: it waits for earlier work on every
// blocking stream of the device (the per-thread compute streams included), and later work on
// those streams waits for it, so no event is needed around a staged transfer.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/host_staging.h"

namespace loom::kernels::cuda {
namespace {

void* pinned_host_alloc_cuda(size_t bytes) {
  void* ptr = nullptr;
  CUDA_CHECK(cudaMallocHost(&ptr, bytes > 0 ? bytes : 1));
  return ptr;
}

void pinned_host_free_cuda(void* ptr) {
  if (ptr == nullptr) return;
  if (cudaFreeHost(ptr) != cudaSuccess) (void)cudaGetLastError();  // never throws
}

void check_staged(const Tensor& t, const void* host, const char* op) {
  LOOM_CHECK(t.device().type == DeviceType::kCuda, op, ": tensor is on ", t.device().str(),
             ", expected a CUDA tensor");
  LOOM_CHECK(t.is_contiguous(), op, ": tensor must be contiguous");
  LOOM_CHECK(host != nullptr || t.numel() == 0, op, ": null host buffer");
}

void copy_device_to_pinned_cuda(const Tensor& src, void* dst_host) {
  check_staged(src, dst_host, "copy_device_to_pinned");
  if (src.numel() == 0) return;
  CudaDeviceGuard guard(src.device().index);
  CUDA_CHECK(cudaMemcpy(dst_host, src.raw_data(), src.nbytes(), cudaMemcpyDeviceToHost));
}

void copy_pinned_to_device_cuda(const void* src_host, Tensor& dst) {
  check_staged(dst, src_host, "copy_pinned_to_device");
  if (dst.numel() == 0) return;
  CudaDeviceGuard guard(dst.device().index);
  CUDA_CHECK(cudaMemcpy(dst.raw_data(), src_host, dst.nbytes(), cudaMemcpyHostToDevice));
}

}  // namespace

LOOM_REGISTER_KERNEL(pinned_host_alloc, kCuda, pinned_host_alloc_cuda);
LOOM_REGISTER_KERNEL(pinned_host_free, kCuda, pinned_host_free_cuda);
LOOM_REGISTER_KERNEL(copy_device_to_pinned, kCuda, copy_device_to_pinned_cuda);
LOOM_REGISTER_KERNEL(copy_pinned_to_device, kCuda, copy_pinned_to_device_cuda);

}  // namespace loom::kernels::cuda
