// kernels/cuda/reduce.cu — CUDA sum over one dimension, the sum of squares, the clipping factor
// and the loss-scaling step (kernels/reduce.h). The sums are deterministic: no float atomics, every
// sum in double over chunks whose size is fixed here (not by the GPU), each chunk reduced by a
// fixed-shape tree, chunk partials summed in chunk order by a second pass. The result depends on
// the shapes only, not on the device or the run. Runs on the compute stream; must not synchronise
// the host.
#include "kernels/cuda/vec_map.cuh"
#include "kernels/reduce.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kReduceThreads = 256;    // fixed: the tree's shape depends on it (launch bounds)
constexpr int64_t kRowChunk = 8192;    // elements of one row reduced by one block (pass 1)
constexpr int64_t kColChunkRows = 64;  // rows of one column chunk (pass 1, inner > 1)
static_assert(kReduceThreads % 32 == 0 && kReduceThreads <= 32 * 32, "block_sum's shape");

// Sum of v over the block in a fixed order; the result is valid in thread 0. Every thread of the
// block must call it; `scratch` holds kReduceThreads / 32 doubles and may be reused on return.
__device__ double block_sum(double v, double* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kReduceThreads / 32 ? scratch[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  }
  __syncthreads();  // scratch is free again
  return v;
}

template <bool Square, typename T>
__device__ __forceinline__ double term(T v) {
  const double d = static_cast<double>(convert<compute_t<T>>(v));
  return Square ? d * d : d;
}

template <typename Out>
__device__ __forceinline__ Out from_double(double v) {
  if constexpr (std::is_same_v<Out, double>) {
    return v;
  } else {
    return convert<Out>(static_cast<compute_t<Out>>(v));
  }
}

// Pass 1 over rows: x (rows, n) contiguous. Block task t = (row, chunk) sums chunk `chunk` of
// row `row`; with one chunk per row the sum goes straight to out[row], else to partial[t].
template <bool Square, typename T, typename Out>
__global__ void __launch_bounds__(kReduceThreads)
    row_sum_kernel(const T* x, int64_t rows, int64_t n, int64_t chunks, Out* out, double* partial) {
  __shared__ double scratch[kReduceThreads / 32];
  for (int64_t t = blockIdx.x; t < rows * chunks; t += gridDim.x) {
    const int64_t row = t / chunks, chunk = t % chunks;
    const int64_t begin = chunk * kRowChunk;
    const int64_t end = begin + kRowChunk < n ? begin + kRowChunk : n;
    const T* xr = x + row * n;
    double acc = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += kReduceThreads) acc += term<Square>(xr[i]);
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) {
      if (chunks == 1) {
        out[row] = from_double<Out>(acc);
      } else {
        partial[t] = acc;
      }
    }
  }
}

// Pass 2 over rows: out[row] = Σ_chunk partial[row, chunk], one block per row.
template <typename Out>
__global__ void __launch_bounds__(kReduceThreads)
    row_partial_sum_kernel(const double* partial, int64_t rows, int64_t chunks, Out* out) {
  __shared__ double scratch[kReduceThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    double acc = 0.0;
    for (int64_t c = threadIdx.x; c < chunks; c += kReduceThreads) acc += partial[row * chunks + c];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[row] = from_double<Out>(acc);
  }
}

// Pass 1 over columns: x (outer, n, inner). Thread (o, chunk, c) sums rows of its chunk in order.
template <typename T>
__global__ void __launch_bounds__(kReduceThreads)
    col_sum_kernel(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t chunks, T* out,
                   double* partial) {
  const int64_t total = outer * chunks * inner;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const int64_t c = i % inner;
    const int64_t oc = i / inner;  // o * chunks + chunk
    const int64_t o = oc / chunks, chunk = oc % chunks;
    const int64_t begin = chunk * kColChunkRows;
    const int64_t end = begin + kColChunkRows < n ? begin + kColChunkRows : n;
    double acc = 0.0;
    for (int64_t j = begin; j < end; ++j) acc += term<false>(x[(o * n + j) * inner + c]);
    if (chunks == 1) {
      out[o * inner + c] = from_double<T>(acc);
    } else {
      partial[i] = acc;
    }
  }
}

// Pass 2 over columns: out[o, c] = Σ_chunk partial[o, chunk, c] in chunk order.
template <typename T>
__global__ void __launch_bounds__(kReduceThreads)
    col_partial_sum_kernel(const double* partial, int64_t outer, int64_t inner, int64_t chunks,
                           T* out) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < outer * inner;
       i += step) {
    const int64_t o = i / inner, c = i % inner;
    double acc = 0.0;
    for (int64_t k = 0; k < chunks; ++k) acc += partial[(o * chunks + k) * inner + c];
    out[i] = from_double<T>(acc);
  }
}

unsigned blocks_for(int64_t tasks) {
  constexpr int64_t kMaxBlocks = 65535 * 8;
  return static_cast<unsigned>(tasks < kMaxBlocks ? tasks : kMaxBlocks);
}

// Σ over rows of (rows, n) into out (rows); `Square` sums squares instead.
template <bool Square, typename T, typename Out>
void row_sums(const Tensor& x, int64_t rows, int64_t n, Out* out) {
  const T* px = static_cast<const T*>(x.raw_data());
  const int64_t chunks = n == 0 ? 1 : (n + kRowChunk - 1) / kRowChunk;
  Tensor partial;
  double* pp = nullptr;
  if (chunks > 1) {
    partial = Tensor::empty({rows * chunks}, DType::kF64, x.device());
    pp = partial.data<double>();
  }
  row_sum_kernel<Square, T, Out>
      <<<blocks_for(rows * chunks), kReduceThreads, 0, compute_stream()>>>(px, rows, n, chunks, out,
                                                                           pp);
  LOOM_CUDA_LAUNCH_CHECK();
  if (chunks > 1) {
    row_partial_sum_kernel<Out>
        <<<blocks_for(rows), kReduceThreads, 0, compute_stream()>>>(pp, rows, chunks, out);
    LOOM_CUDA_LAUNCH_CHECK();
  }
}

void sum_dim_forward_cuda(const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out) {
  LOOM_CHECK(outer >= 0 && n >= 0 && inner >= 0 && outer * n * inner == x.numel(),
             "sum_dim_forward: (", outer, ", ", n, ", ", inner, ") does not cover ", x.numel(),
             " elements");
  LOOM_CHECK(out.numel() == outer * inner, "sum_dim_forward: out has ", out.numel(),
             " elements, expected ", outer * inner);
  LOOM_CHECK(x.is_contiguous() && out.is_contiguous(),
             "sum_dim_forward: cuda kernel needs contiguous x and out");
  LOOM_CHECK(x.dtype() == out.dtype(), "sum_dim_forward: dtypes ", dtype_name(x.dtype()), " and ",
             dtype_name(out.dtype()), " differ");
  if (out.numel() == 0) return;
  CudaDeviceGuard guard(out.device().index);
  LOOM_CUDA_DISPATCH_FLOAT(x.dtype(), "sum_dim_forward", [&] {
    using T = scalar_t;
    T* po = static_cast<T*>(out.raw_data());
    if (inner == 1) {
      row_sums<false, T, T>(x, outer, n, po);
      return;
    }
    const T* px = static_cast<const T*>(x.raw_data());
    const int64_t chunks = n == 0 ? 1 : (n + kColChunkRows - 1) / kColChunkRows;
    Tensor partial;
    double* pp = nullptr;
    if (chunks > 1) {
      partial = Tensor::empty({outer * chunks * inner}, DType::kF64, x.device());
      pp = partial.data<double>();
    }
    const int64_t total = outer * chunks * inner;
    col_sum_kernel<T><<<grid_for(total, kReduceThreads), kReduceThreads, 0, compute_stream()>>>(
        px, outer, n, inner, chunks, po, pp);
    LOOM_CUDA_LAUNCH_CHECK();
    if (chunks > 1) {
      col_partial_sum_kernel<T>
          <<<grid_for(outer * inner, kReduceThreads), kReduceThreads, 0, compute_stream()>>>(
              pp, outer, inner, chunks, po);
      LOOM_CUDA_LAUNCH_CHECK();
    }
  });
}

void sum_squares_forward_cuda(const Tensor& x, Tensor& out) {
  LOOM_CHECK(x.is_contiguous(), "sum_squares_forward: cuda kernel needs a contiguous x");
  LOOM_CHECK(out.numel() == 1 && out.dtype() == DType::kF64,
             "sum_squares_forward: out must be one f64 element, got ", shape_str(out.shape()), " ",
             dtype_name(out.dtype()));
  CudaDeviceGuard guard(out.device().index);
  LOOM_CUDA_DISPATCH_FLOAT(x.dtype(), "sum_squares_forward", [&] {
    row_sums<true, scalar_t, double>(x, 1, x.numel(), out.data<double>());
  });
}

// One thread: out = clip_factor(sqrt(sq_sum), max_norm), the host's formula (kernels/reduce.h).
__global__ void __launch_bounds__(32)
    clip_factor_kernel(const double* sq_sum, double max_norm, double* out) {
  if (threadIdx.x == 0) *out = clip_factor(__dsqrt_rn(*sq_sum), max_norm);
}

void clip_factor_forward_cuda(const Tensor& sq_sum, double max_norm, Tensor& out) {
  LOOM_CHECK(sq_sum.numel() == 1 && sq_sum.dtype() == DType::kF64 && out.numel() == 1 &&
                 out.dtype() == DType::kF64 && sq_sum.device() == out.device(),
             "clip_factor_forward: sq_sum and out must be one f64 element each, on one device");
  CudaDeviceGuard guard(out.device().index);
  clip_factor_kernel<<<1, 32, 0, compute_stream()>>>(sq_sum.data<double>(), max_norm,
                                                     out.data<double>());
  LOOM_CUDA_LAUNCH_CHECK();
}

// One thread: the factor and the updated state (kernels/reduce.h, Note [Loss scale rule]).
__global__ void __launch_bounds__(32)
    loss_scale_kernel(const double* sq_sum, double max_norm, double growth_interval, double* state,
                      double* factor) {
  if (threadIdx.x == 0)
    *factor = loss_scale_step_values(__dsqrt_rn(*sq_sum), max_norm, growth_interval, state);
}

void loss_scale_step_cuda(const Tensor& sq_sum, Tensor& state, double max_norm,
                          int64_t growth_interval, Tensor& factor) {
  check_loss_scale_step_args(sq_sum, state, growth_interval, factor);
  CudaDeviceGuard guard(state.device().index);
  loss_scale_kernel<<<1, 32, 0, compute_stream()>>>(sq_sum.data<double>(), max_norm,
                                                    static_cast<double>(growth_interval),
                                                    state.data<double>(), factor.data<double>());
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

LOOM_REGISTER_KERNEL(sum_dim_forward, kCuda, sum_dim_forward_cuda);
LOOM_REGISTER_KERNEL(sum_squares_forward, kCuda, sum_squares_forward_cuda);
LOOM_REGISTER_KERNEL(clip_factor_forward, kCuda, clip_factor_forward_cuda);
LOOM_REGISTER_KERNEL(loss_scale_step, kCuda, loss_scale_step_cuda);

}  // namespace loom::kernels::cuda
