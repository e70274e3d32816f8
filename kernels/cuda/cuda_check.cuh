// kernels/cuda/cuda_check.cuh — the CUDA and cuBLAS return-code checks. Every failing call
// throws loom::Error naming the call, the error's name and text, and the file:line of the call
// site. Included only by code under kernels/cuda/ (and later parallel/comm/nccl*); nothing here
// may be included from a header outside those directories (see DESIGN §2: no CUDA in headers).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace loom::kernels::cuda::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file,
                                          int line) {
  // Reading the last error clears it (for non-sticky errors), so a later launch check does not
  // report this failure a second time.
  (void)cudaGetLastError();
  throw ::loom::Error(
      ::loom::detail::str(call, " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)),
      file, line);
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t st, const char* call, const char* file,
                                            int line) {
  throw ::loom::Error(::loom::detail::str(call, " failed: ", cublasGetStatusName(st), ": ",
                                          cublasGetStatusString(st)),
                      file, line);
}

}  // namespace loom::kernels::cuda::detail

// CUDA_CHECK(cudaMalloc(&p, n)): throws loom::Error when the call does not return cudaSuccess.
#define CUDA_CHECK(call)                                                                          \
  do {                                                                                            \
    const cudaError_t loom_cuda_err_ = (call);                                                    \
    if (loom_cuda_err_ != cudaSuccess) {                                                          \
      ::loom::kernels::cuda::detail::throw_cuda_error(loom_cuda_err_, #call, __FILE__, __LINE__); \
    }                                                                                             \
  } while (0)

// CUBLAS_CHECK(cublasSgemm(...)): throws loom::Error when the call does not return success.
#define CUBLAS_CHECK(call)                                                                \
  do {                                                                                    \
    const cublasStatus_t loom_cublas_st_ = (call);                                        \
    if (loom_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                       \
      ::loom::kernels::cuda::detail::throw_cublas_error(loom_cublas_st_, #call, __FILE__, \
                                                        __LINE__);                        \
    }                                                                                     \
  } while (0)

// LOOM_CUDA_LAUNCH_CHECK(): after every kernel launch. Catches launch errors (bad grid, too
// many resources) at once; debug builds (NDEBUG undefined) also synchronise the compute stream
// (every kernel is launched there) so that a fault inside the kernel is reported at its launch
// site rather than at some later call. Not the whole device: an NCCL kernel waiting for a peer
// on a communication stream would hold the host here, and a schedule that overlaps
// communication could deadlock.
#ifdef NDEBUG
#define LOOM_CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())
#else
#define LOOM_CUDA_LAUNCH_CHECK()                            \
  do {                                                      \
    CUDA_CHECK(cudaGetLastError());                         \
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread)); \
  } while (0)
#endif
