// kernels/cuda/cublaslt_handle.cuh — the BLAS context of one (thread, device): a cuBLASLt handle
// with its 32 MiB workspace (one cudaMalloc, at first use) and a cuBLAS handle (f64 and the
// layouts cuBLASLt has no algorithm for), created lazily by blas_context() and kept until the
// thread exits. Work through them goes on compute_stream(), which is per thread too, so the
// workspace is never used by two GEMMs at once. Holds no other state; included only by
// kernels/cuda/ sources.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"

namespace loom::kernels::cuda {

class BlasContext {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // Creates the handles and the workspace on `device`.
  explicit BlasContext(int device) {
    CudaDeviceGuard guard(device);
    CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    const cublasStatus_t st = cublasLtCreate(&lt_);
    if (st != CUBLAS_STATUS_SUCCESS) {
      (void)cudaFree(workspace_);
      CUBLAS_CHECK(st);
    }
  }
  // Errors are ignored here: at process exit the CUDA runtime may already be unloading.
  ~BlasContext() {
    if (blas_ != nullptr) (void)cublasDestroy(blas_);
    (void)cublasLtDestroy(lt_);
    (void)cudaFree(workspace_);
  }
  BlasContext(const BlasContext&) = delete;
  BlasContext& operator=(const BlasContext&) = delete;

  cublasLtHandle_t lt() const { return lt_; }
  void* workspace() const { return workspace_; }
  // The cuBLAS handle, created at first use, bound to compute_stream() on every call.
  cublasHandle_t blas() {
    if (blas_ == nullptr) CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, compute_stream()));
    return blas_;
  }

 private:
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
};

// The calling thread's context on `device` (the caller has made `device` current).
inline BlasContext& blas_context(int device) {
  thread_local std::map<int, std::unique_ptr<BlasContext>> contexts;
  std::unique_ptr<BlasContext>& slot = contexts[device];
  if (!slot) slot = std::make_unique<BlasContext>(device);
  return *slot;
}

}  // namespace loom::kernels::cuda
