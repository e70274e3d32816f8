// kernels/cuda/softmax.cu — CUDA softmax over the last dimension, forward and backward, with the
// contract of kernels/softmax.h (contiguous (N, C); the backward accumulates into dx). One block
// per row; the row is read from global memory once and kept in shared memory for the later
// passes (Note [Row cache] in kernels/cuda/row_io.cuh); max, sums and products in f32 (f64 for
// f64 tensors), so bf16/f16 are storage only. Must not allocate or synchronise the host.
#include <cuda_runtime.h>

#include <limits>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/row_io.cuh"
#include "kernels/softmax.h"

namespace loom::kernels::cuda {
namespace {

template <typename A>
__device__ __forceinline__ A exp_acc(A v) {
  if constexpr (std::is_same_v<A, double>) {
    return exp(v);
  } else {
    return expf(v);
  }
}

// y (rows, cols) = softmax of x (rows, cols) along cols. cache: null, or dynamic shared memory
// for one row (Note [Row cache]); it holds x, then exp(x − max).
template <typename T, int W>
__global__ void __launch_bounds__(kRowMaxThreads)
    softmax_forward_kernel(const T* x, T* y, int64_t rows, int64_t cols, bool use_cache) {
  using A = AccT<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ A red[kWarpSize];
  A* cache = reinterpret_cast<A*>(smem);
  const int64_t packs = cols / W;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    A mx = -std::numeric_limits<A>::infinity();
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      A v[W];
      load_pack<W>(xr + p * W, v);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        if (use_cache) cache[k * packs + p] = v[k];
        mx = v[k] > mx ? v[k] : mx;
      }
    }
    mx = block_max(mx, red);
    A s = 0;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      A v[W];
      if (use_cache) {
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = cache[k * packs + p];
      } else {
        load_pack<W>(xr + p * W, v);
      }
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const A e = exp_acc(v[k] - mx);
        if (use_cache) cache[k * packs + p] = e;
        s += e;
      }
    }
    const A inv = A(1) / block_sum(s, red);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      A v[W];
      if (use_cache) {
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = cache[k * packs + p];
      } else {
        load_pack<W>(xr + p * W, v);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = exp_acc(v[k] - mx);
      }
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] *= inv;
      store_pack<W>(yr + p * W, v);
    }
  }
}

// dx (rows, cols) += y · (dy − Σ_cols dy·y). cache: null, or shared memory for two rows (y, dy).
template <typename T, int W>
__global__ void __launch_bounds__(kRowMaxThreads)
    softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols,
                            bool use_cache) {
  using A = AccT<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ A red[kWarpSize];
  A* cy = reinterpret_cast<A*>(smem);
  A* cdy = cy + cols;
  const int64_t packs = cols / W;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * cols;
    A dot = 0;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      A vy[W], vdy[W];
      load_pack<W>(y + base + p * W, vy);
      load_pack<W>(dy + base + p * W, vdy);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        if (use_cache) {
          cy[k * packs + p] = vy[k];
          cdy[k * packs + p] = vdy[k];
        }
        dot += vdy[k] * vy[k];
      }
    }
    dot = block_sum(dot, red);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      A vy[W], vdy[W], vdx[W];
      if (use_cache) {
#pragma unroll
        for (int k = 0; k < W; ++k) {
          vy[k] = cy[k * packs + p];
          vdy[k] = cdy[k * packs + p];
        }
      } else {
        load_pack<W>(y + base + p * W, vy);
        load_pack<W>(dy + base + p * W, vdy);
      }
      load_pack<W>(dx + base + p * W, vdx);
#pragma unroll
      for (int k = 0; k < W; ++k) vdx[k] += vy[k] * (vdy[k] - dot);
      store_pack<W>(dx + base + p * W, vdx);
    }
  }
}

// rows and cols of a contiguous (…, C) tensor; checks that `others` match it.
void check_rows(const char* op, const Tensor& a, std::initializer_list<const Tensor*> others,
                int64_t& rows, int64_t& cols) {
  LOOM_CHECK(a.dim() >= 1, op, ": input must have at least one dimension");
  for (const Tensor* t : others) {
    LOOM_CHECK(t->shape() == a.shape() && t->dtype() == a.dtype(), op, ": tensors ",
               shape_str(a.shape()), " ", dtype_name(a.dtype()), " and ", shape_str(t->shape()),
               " ", dtype_name(t->dtype()), " must match");
    LOOM_CHECK(t->is_contiguous(), op, ": tensors must be contiguous");
  }
  LOOM_CHECK(a.is_contiguous(), op, ": tensors must be contiguous");
  cols = a.size(-1);
  rows = cols > 0 ? a.numel() / cols : 0;
}

template <typename T, int W>
void softmax_forward_launch(const T* x, T* y, int64_t rows, int64_t cols) {
  const size_t bytes = static_cast<size_t>(cols) * sizeof(AccT<T>);
  const bool cache = bytes <= row_cache_budget();
  const size_t smem = cache ? bytes : 0;
  allow_dynamic_smem(softmax_forward_kernel<T, W>, smem);
  softmax_forward_kernel<T, W>
      <<<row_grid(rows), row_threads(cols / W, 2), smem, compute_stream()>>>(x, y, rows, cols,
                                                                             cache);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <typename T, int W>
void softmax_backward_launch(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols) {
  const size_t bytes = 2 * static_cast<size_t>(cols) * sizeof(AccT<T>);
  const bool cache = bytes <= row_cache_budget();
  const size_t smem = cache ? bytes : 0;
  allow_dynamic_smem(softmax_backward_kernel<T, W>, smem);
  softmax_backward_kernel<T, W>
      <<<row_grid(rows), row_threads(cols / W, 2), smem, compute_stream()>>>(y, dy, dx, rows, cols,
                                                                             cache);
  LOOM_CUDA_LAUNCH_CHECK();
}

void softmax_forward_cuda(const Tensor& x, Tensor& y) {
  int64_t rows = 0, cols = 0;
  check_rows("softmax_forward", x, {&y}, rows, cols);
  if (rows == 0) return;
  CudaDeviceGuard guard(x.device().index);
  LOOM_CUDA_DISPATCH_FLOAT(x.dtype(), "softmax_forward", [&] {
    constexpr int kW = kPackWidth<scalar_t>;
    const auto* px = static_cast<const scalar_t*>(x.raw_data());
    auto* py = static_cast<scalar_t*>(y.raw_data());
    if (cols % kW == 0 && aligned16({px, py})) {
      softmax_forward_launch<scalar_t, kW>(px, py, rows, cols);
    } else {
      softmax_forward_launch<scalar_t, 1>(px, py, rows, cols);
    }
  });
}

void softmax_backward_cuda(const Tensor& y, const Tensor& dy, Tensor& dx) {
  int64_t rows = 0, cols = 0;
  check_rows("softmax_backward", y, {&dy, &dx}, rows, cols);
  if (rows == 0) return;
  CudaDeviceGuard guard(y.device().index);
  LOOM_CUDA_DISPATCH_FLOAT(y.dtype(), "softmax_backward", [&] {
    constexpr int kW = kPackWidth<scalar_t>;
    const auto* py = static_cast<const scalar_t*>(y.raw_data());
    const auto* pdy = static_cast<const scalar_t*>(dy.raw_data());
    auto* pdx = static_cast<scalar_t*>(dx.raw_data());
    if (cols % kW == 0 && aligned16({py, pdy, pdx})) {
      softmax_backward_launch<scalar_t, kW>(py, pdy, pdx, rows, cols);
    } else {
      softmax_backward_launch<scalar_t, 1>(py, pdy, pdx, rows, cols);
    }
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(softmax_forward, kCuda, softmax_forward_cuda);
LOOM_REGISTER_KERNEL(softmax_backward, kCuda, softmax_backward_cuda);

}  // namespace loom::kernels::cuda
