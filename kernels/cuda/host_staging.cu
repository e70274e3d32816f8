// kernels/cuda/host_staging.cu — the CUDA side of kernels/host_staging.h: cudaMallocHost /
// cudaFreeHost, blocking cudaMemcpy between a device tensor and a pinned host buffer, and the
// asynchronous device→pinned copy on the compute stream with an event to wait on, and the test
// gate (a kernel spinning on a mapped pinned flag). Holds no buffers itself (callers own and
// cache them); the gate's kernel is its only launch.
//
// The blocking copies use cudaMemcpy, i.e. the legacy default stream: it waits for earlier work
// on every blocking stream of the device (the per-thread compute streams included), and later
// work on those streams waits for it, so no event is needed around a staged transfer. The
// asynchronous copy runs on the calling thread's compute stream, so it follows the kernels that
// wrote src, and memory freed after it is reused only by work ordered after it.
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

// The event recorded behind the copy; destroyed with the handle (never throws). A blocking-sync
// event: the trainer may wait on it for most of a step, and a spinning wait would take a core
// from the other ranks' launch threads on a shared node.
class CudaHostCopy final : public HostCopy {
 public:
  explicit CudaHostCopy(int device) : device_(device) {
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming | cudaEventBlockingSync));
  }
  ~CudaHostCopy() override {
    if (cudaEventDestroy(done_) != cudaSuccess) (void)cudaGetLastError();
  }
  CudaHostCopy(const CudaHostCopy&) = delete;
  CudaHostCopy& operator=(const CudaHostCopy&) = delete;
  cudaEvent_t event() const { return done_; }
  void wait() override {
    CudaDeviceGuard guard(device_);
    CUDA_CHECK(cudaEventSynchronize(done_));
  }

 private:
  int device_;
  cudaEvent_t done_ = nullptr;
};

std::unique_ptr<HostCopy> copy_device_to_pinned_async_cuda(const Tensor& src, void* dst_host) {
  check_staged(src, dst_host, "copy_device_to_pinned_async");
  CudaDeviceGuard guard(src.device().index);
  auto copy = std::make_unique<CudaHostCopy>(src.device().index);
  if (src.numel() > 0) {
    CUDA_CHECK(cudaMemcpyAsync(dst_host, src.raw_data(), src.nbytes(), cudaMemcpyDeviceToHost,
                               compute_stream()));
  }
  CUDA_CHECK(cudaEventRecord(copy->event(), compute_stream()));
  return copy;
}

// Spins (sleeping between reads) until the host sets *open through the mapped page.
__global__ void __launch_bounds__(32) wait_for_gate_kernel(const volatile int* open) {
  if (threadIdx.x != 0) return;
  while (*open == 0) __nanosleep(10000);
}

class CudaStreamGate final : public StreamGate {
 public:
  explicit CudaStreamGate(int device) : device_(device) {
    CudaDeviceGuard guard(device);
    CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&flag_), sizeof(int), cudaHostAllocMapped));
    __atomic_store_n(flag_, 0, __ATOMIC_SEQ_CST);
    int* on_device = nullptr;
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&on_device), flag_, 0));
    CUDA_CHECK(cudaEventCreateWithFlags(&passed_, cudaEventDisableTiming));
    wait_for_gate_kernel<<<1, 32, 0, compute_stream()>>>(on_device);
    CUDA_CHECK(cudaGetLastError());  // not LOOM_CUDA_LAUNCH_CHECK: a debug build would wait here
    CUDA_CHECK(cudaEventRecord(passed_, compute_stream()));
  }
  ~CudaStreamGate() override {  // never throws: the flag is freed only once the kernel is done
    open();
    CudaDeviceGuard guard(device_);
    if (cudaEventSynchronize(passed_) == cudaSuccess) (void)cudaFreeHost(flag_);
    (void)cudaEventDestroy(passed_);
    (void)cudaGetLastError();
  }
  CudaStreamGate(const CudaStreamGate&) = delete;
  CudaStreamGate& operator=(const CudaStreamGate&) = delete;
  void open() override { __atomic_store_n(flag_, 1, __ATOMIC_SEQ_CST); }

 private:
  int device_;
  int* flag_ = nullptr;
  cudaEvent_t passed_ = nullptr;
};

std::unique_ptr<StreamGate> hold_compute_stream_cuda(int device) {
  return std::make_unique<CudaStreamGate>(device);
}

}  // namespace

LOOM_REGISTER_KERNEL(pinned_host_alloc, kCuda, pinned_host_alloc_cuda);
LOOM_REGISTER_KERNEL(pinned_host_free, kCuda, pinned_host_free_cuda);
LOOM_REGISTER_KERNEL(copy_device_to_pinned, kCuda, copy_device_to_pinned_cuda);
LOOM_REGISTER_KERNEL(copy_pinned_to_device, kCuda, copy_pinned_to_device_cuda);
LOOM_REGISTER_KERNEL(copy_device_to_pinned_async, kCuda, copy_device_to_pinned_async_cuda);
LOOM_REGISTER_KERNEL(hold_compute_stream, kCuda, hold_compute_stream_cuda);

}  // namespace loom::kernels::cuda
