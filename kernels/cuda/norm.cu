// kernels/cuda/norm.cu — CUDA LayerNorm, RMSNorm and residual add + LayerNorm, forward and
// backward, with the contracts of kernels/norm.h (backward kernels accumulate into dx, dweight,
// dbias). One kernel pair serves all three ops (LayerNorm centres the row, RMSNorm does not; the
// residual form adds r first). Dtypes f32, f64, and bf16/f16 as storage with f32 arithmetic and
// f32 statistics. Must not allocate outputs (only its own scratch) or synchronise the host.
//
// Forward: one block per row; the row is read once and kept in shared memory for the variance
// and output passes (Note [Row cache] in kernels/cuda/row_io.cuh).
//
// Note [Deterministic CUDA norm gradients]: dweight and dbias sum over rows without atomics.
// Rows are split into chunks of max(kMinChunkRows, ⌈N / target⌉) rows, target = the number of
// blocks that gives about kTargetThreads threads in all (a function of C through the block
// size). One block walks its chunk's rows in order, each thread adding the terms of the
// columns it owns (always the same ones) into per-block partial sums, which are
// written to a scratch (chunks, parts, C). A second kernel adds each column's partials: thread
// group g of kReduceGroups sums chunks g, g + kReduceGroups, … in order, then the group sums are
// added in group order. The result bits depend on N, C and whether the rows are 16-byte aligned
// (the block size follows the pack width), not on the GPU or on timing.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/row_io.cuh"
#include "kernels/norm.h"

namespace loom::kernels::cuda {
namespace {

constexpr int64_t kMinChunkRows = 8;
constexpr int64_t kTargetThreads = 128 * 1024;  // enough to fill a large GPU several times
constexpr int64_t kMaxChunks = 2048;
constexpr int kReduceCols = 32;    // columns per reduce block (one warp's worth, coalesced)
constexpr int kReduceGroups = 16;  // chunk groups per reduce block

// Storage type of the saved statistics (kernels/norm.h: norm_stat_dtype).
template <typename T>
using StatT = std::conditional_t<kIsHalf<T>, float, T>;

template <typename A>
__device__ __forceinline__ A sqrt_acc(A v) {
  if constexpr (std::is_same_v<A, double>) {
    return sqrt(v);
  } else {
    return sqrtf(v);
  }
}

template <typename T>
struct NormForwardArgs {
  const T* x;      // x (rows, cols)
  const T* r;      // r (rows, cols): residual added to x first, or null
  const T* w;      // weight (cols)
  const T* b;      // bias (cols) or null
  T* s;            // s (rows, cols) = x + r, written when r is set
  T* y;            // y (rows, cols)
  StatT<T>* mean;  // mean (rows), or null (RMSNorm)
  StatT<T>* rstd;  // rstd (rows)
  int64_t rows, cols;
  double eps;
  bool center;     // LayerNorm (subtract the row mean) rather than RMSNorm
  bool use_cache;  // dynamic shared memory holds one row (Note [Row cache])
};

template <typename T, int W>
__global__ void __launch_bounds__(kRowMaxThreads) norm_forward_kernel(NormForwardArgs<T> a) {
  using A = AccT<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ A red[kWarpSize];
  A* cache = reinterpret_cast<A*>(smem);
  const int64_t packs = a.cols / W;
  const A n = static_cast<A>(a.cols);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t base = row * a.cols;
    // Where later passes re-read the row when it is not cached: x, or the sum this thread wrote.
    const T* src = a.r != nullptr ? a.s + base : a.x + base;
    auto row_values = [&](int64_t p, A(&v)[W]) {
      if (a.use_cache) {
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = cache[k * packs + p];
      } else {
        load_pack<W>(src + p * W, v);
      }
    };
    A s1 = 0;  // Σx (LayerNorm) or Σx² (RMSNorm)
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      A v[W];
      load_pack<W>(a.x + base + p * W, v);
      if (a.r != nullptr) {
        A rv[W];
        load_pack<W>(a.r + base + p * W, rv);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] = round_to<T>(v[k] + rv[k]);
        store_pack<W>(a.s + base + p * W, v);
      }
#pragma unroll
      for (int k = 0; k < W; ++k) {
        if (a.use_cache) cache[k * packs + p] = v[k];
        s1 += a.center ? v[k] : v[k] * v[k];
      }
    }
    A mean = 0, var = 0;
    if (a.center) {
      mean = block_sum(s1, red) / n;
      A s2 = 0;
      for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
        A v[W];
        row_values(p, v);
#pragma unroll
        for (int k = 0; k < W; ++k) s2 += (v[k] - mean) * (v[k] - mean);
      }
      var = block_sum(s2, red) / n;
    } else {
      var = block_sum(s1, red) / n;
    }
    const A rstd = A(1) / sqrt_acc(var + static_cast<A>(a.eps));
    if (threadIdx.x == 0) {
      if (a.mean != nullptr) a.mean[row] = static_cast<StatT<T>>(mean);
      a.rstd[row] = static_cast<StatT<T>>(rstd);
    }
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      A v[W], w[W];
      row_values(p, v);
      load_pack<W>(a.w + p * W, w);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = (v[k] - mean) * rstd * w[k];
      if (a.b != nullptr) {
        A bv[W];
        load_pack<W>(a.b + p * W, bv);
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] += bv[k];
      }
      store_pack<W>(a.y + base + p * W, v);
    }
  }
}

template <typename T>
struct NormBackwardArgs {
  const T* dy;           // dy (rows, cols)
  const T* ds;           // ds (rows, cols): added to dx (residual form), or null
  const T* x;            // x (rows, cols): the normalised input (s for the residual form)
  const T* w;            // weight (cols)
  const StatT<T>* mean;  // mean (rows), or null (RMSNorm)
  const StatT<T>* rstd;  // rstd (rows)
  T* dx;                 // dx (rows, cols), accumulated
  AccT<T>* partial;      // partial (chunks, parts, cols): Σ dy·x̂ (part 0), Σ dy (part 1)
  int64_t rows, cols, chunk;
  int parts;         // 1 (dweight) or 2 (dweight and dbias)
  bool center;       // LayerNorm rather than RMSNorm
  bool acc_in_smem;  // the block's partial sums live in shared memory (else in `partial`)
  bool use_cache;    // shared memory also holds the row's dy and x̂ (Note [Row cache])
};

// One block per chunk of rows (Note [Deterministic CUDA norm gradients]). Shared memory:
// [partial sums: parts·cols when acc_in_smem][dy cache: cols][x̂ cache: cols when use_cache].
template <typename T, int W>
__global__ void __launch_bounds__(kRowMaxThreads) norm_backward_kernel(NormBackwardArgs<T> a) {
  using A = AccT<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ A red[2 * kWarpSize];
  const int64_t packs = a.cols / W;
  const A n = static_cast<A>(a.cols);
  A* sacc = reinterpret_cast<A*>(smem);
  A* cdy = sacc + (a.acc_in_smem ? a.parts * a.cols : 0);
  A* cxh = cdy + a.cols;
  A* gacc = a.partial + static_cast<int64_t>(blockIdx.x) * a.parts * a.cols;
  // Thread-owned partial sum of value k of pack p (shared: bank-friendly; global: column order).
  auto acc = [&](int part, int k, int64_t p) -> A& {
    return a.acc_in_smem ? sacc[part * a.cols + k * packs + p] : gacc[part * a.cols + p * W + k];
  };
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    for (int part = 0; part < a.parts; ++part) {
#pragma unroll
      for (int k = 0; k < W; ++k) acc(part, k, p) = 0;
    }
  }
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * a.chunk;
  const int64_t row_end = row0 + a.chunk < a.rows ? row0 + a.chunk : a.rows;
  for (int64_t row = row0; row < row_end; ++row) {
    const int64_t base = row * a.cols;
    const A m = a.mean != nullptr ? static_cast<A>(a.mean[row]) : A(0);
    const A q = static_cast<A>(a.rstd[row]);
    A sums[2] = {0, 0};  // Σ g and Σ g·x̂ with g = dy·w
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      A vdy[W], vx[W], vw[W];
      load_pack<W>(a.dy + base + p * W, vdy);
      load_pack<W>(a.x + base + p * W, vx);
      load_pack<W>(a.w + p * W, vw);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const A xh = (vx[k] - m) * q, g = vdy[k] * vw[k];
        sums[0] += g;
        sums[1] += g * xh;
        if (a.use_cache) {
          cdy[k * packs + p] = vdy[k];
          cxh[k * packs + p] = xh;
        }
      }
    }
    block_sum<2>(sums, red);
    const A mg = a.center ? sums[0] / n : A(0), mgx = sums[1] / n;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      A vdy[W], xh[W], vw[W], vdx[W];
      if (a.use_cache) {
#pragma unroll
        for (int k = 0; k < W; ++k) {
          vdy[k] = cdy[k * packs + p];
          xh[k] = cxh[k * packs + p];
        }
      } else {
        load_pack<W>(a.dy + base + p * W, vdy);
        load_pack<W>(a.x + base + p * W, xh);
#pragma unroll
        for (int k = 0; k < W; ++k) xh[k] = (xh[k] - m) * q;
      }
      load_pack<W>(a.w + p * W, vw);
      load_pack<W>(a.dx + base + p * W, vdx);
      if (a.ds != nullptr) {
        A vds[W];
        load_pack<W>(a.ds + base + p * W, vds);
#pragma unroll
        for (int k = 0; k < W; ++k) vdx[k] += vds[k];
      }
#pragma unroll
      for (int k = 0; k < W; ++k) {
        vdx[k] += q * (vdy[k] * vw[k] - mg - xh[k] * mgx);
        acc(0, k, p) += vdy[k] * xh[k];
        if (a.parts == 2) acc(1, k, p) += vdy[k];
      }
      store_pack<W>(a.dx + base + p * W, vdx);
    }
  }
  if (a.acc_in_smem) {
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      for (int part = 0; part < a.parts; ++part) {
#pragma unroll
        for (int k = 0; k < W; ++k) gacc[part * a.cols + p * W + k] = acc(part, k, p);
      }
    }
  }
}

// dw[c] += Σ_k partial[k, 0, c]; db[c] += Σ_k partial[k, 1, c] (when parts == 2), in the fixed
// order of Note [Deterministic CUDA norm gradients]. Block (kReduceCols, kReduceGroups) threads;
// blockIdx.x picks kReduceCols consecutive entries of the flattened (parts, cols).
template <typename T>
__global__ void __launch_bounds__(kReduceCols* kReduceGroups)
    norm_param_reduce_kernel(const AccT<T>* partial, int64_t chunks, int64_t cols, int parts, T* dw,
                             T* db) {
  using A = AccT<T>;
  __shared__ A group_sums[kReduceGroups][kReduceCols];
  const int64_t total = parts * cols;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kReduceCols + threadIdx.x;
  A sum = 0;
  if (i < total) {
    for (int64_t k = threadIdx.y; k < chunks; k += kReduceGroups) sum += partial[k * total + i];
  }
  group_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && i < total) {
    A t = group_sums[0][threadIdx.x];
    for (int g = 1; g < kReduceGroups; ++g) t += group_sums[g][threadIdx.x];
    const int part = static_cast<int>(i / cols);
    const int64_t c = i % cols;
    T* out = part == 0 ? dw : db;
    out[c] = convert<T>(convert<A>(out[c]) + t);
  }
}

// ---- launchers ----

template <typename T, int W>
void norm_forward_launch(NormForwardArgs<T> a) {
  const size_t bytes = static_cast<size_t>(a.cols) * sizeof(AccT<T>);
  a.use_cache = bytes <= row_cache_budget();
  const size_t smem = a.use_cache ? bytes : 0;
  allow_dynamic_smem(norm_forward_kernel<T, W>, smem);
  norm_forward_kernel<T, W>
      <<<row_grid(a.rows), row_threads(a.cols / W, 2), smem, compute_stream()>>>(a);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <typename T>
void norm_forward(const NormForwardArgs<T>& a) {
  constexpr int kW = kPackWidth<T>;
  if (a.cols % kW == 0 && aligned16({a.x, a.r, a.w, a.b, a.s, a.y})) {
    norm_forward_launch<T, kW>(a);
  } else {
    norm_forward_launch<T, 1>(a);
  }
}

template <typename T, int W>
void norm_backward_launch(NormBackwardArgs<T> a, int device, T* dw, T* db) {
  using A = AccT<T>;
  const int threads = row_threads(a.cols / W, 1);
  const int64_t target = std::clamp<int64_t>(kTargetThreads / threads, 1, kMaxChunks);
  a.chunk = std::max(kMinChunkRows, (a.rows + target - 1) / target);
  const int64_t chunks = (a.rows + a.chunk - 1) / a.chunk;
  Tensor partial = Tensor::empty(Shape{chunks, static_cast<int64_t>(a.parts), a.cols},
                                 DTypeOf<A>::value, Device::cuda(device));
  a.partial = partial.data<A>();
  const size_t acc_bytes = static_cast<size_t>(a.parts) * a.cols * sizeof(A);
  const size_t cache_bytes = 2 * static_cast<size_t>(a.cols) * sizeof(A);
  a.use_cache = acc_bytes + cache_bytes <= row_cache_budget();
  a.acc_in_smem = a.use_cache || acc_bytes <= dynamic_smem_limit();
  const size_t smem = (a.acc_in_smem ? acc_bytes : 0) + (a.use_cache ? cache_bytes : 0);
  allow_dynamic_smem(norm_backward_kernel<T, W>, smem);
  norm_backward_kernel<T, W><<<static_cast<unsigned>(chunks), threads, smem, compute_stream()>>>(a);
  LOOM_CUDA_LAUNCH_CHECK();
  const int64_t total = a.parts * a.cols;
  const auto reduce_blocks = static_cast<unsigned>((total + kReduceCols - 1) / kReduceCols);
  norm_param_reduce_kernel<T>
      <<<reduce_blocks, dim3(kReduceCols, kReduceGroups), 0, compute_stream()>>>(
          a.partial, chunks, a.cols, a.parts, dw, db);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <typename T>
void norm_backward(const NormBackwardArgs<T>& a, int device, T* dw, T* db) {
  constexpr int kW = kPackWidth<T>;
  if (a.cols % kW == 0 && aligned16({a.dy, a.ds, a.x, a.w, a.dx})) {
    norm_backward_launch<T, kW>(a, device, dw, db);
  } else {
    norm_backward_launch<T, 1>(a, device, dw, db);
  }
}

// Checks the tensors of one call and returns (rows, cols) of x. rowwise: (N, C) tensors like x;
// params: (C) tensors (undefined allowed); stats: (N) statistics (undefined allowed).
void check_norm(const char* op, const Tensor& x, std::initializer_list<const Tensor*> rowwise,
                std::initializer_list<const Tensor*> params,
                std::initializer_list<const Tensor*> stats, int64_t& rows, int64_t& cols) {
  LOOM_CHECK(x.dim() >= 1 && x.size(-1) > 0, op, ": input ", shape_str(x.shape()),
             " needs a non-empty last dimension");
  LOOM_CHECK(x.is_contiguous(), op, ": tensors must be contiguous");
  cols = x.size(-1);
  rows = x.numel() / cols;
  for (const Tensor* t : rowwise) {
    if (!t->defined()) continue;
    LOOM_CHECK(t->shape() == x.shape() && t->dtype() == x.dtype() && t->is_contiguous(), op, ": ",
               shape_str(t->shape()), " ", dtype_name(t->dtype()),
               " tensor must be contiguous and match the input ", shape_str(x.shape()), " ",
               dtype_name(x.dtype()));
  }
  for (const Tensor* t : params) {
    if (!t->defined()) continue;
    LOOM_CHECK(t->numel() == cols && t->dtype() == x.dtype() && t->is_contiguous(), op,
               ": parameter ", shape_str(t->shape()), " ", dtype_name(t->dtype()),
               " must be contiguous (", cols, ") ", dtype_name(x.dtype()));
  }
  const DType sd = norm_stat_dtype(x.dtype());
  for (const Tensor* t : stats) {
    if (!t->defined()) continue;
    LOOM_CHECK(t->numel() == rows && t->dtype() == sd && t->is_contiguous(), op, ": statistics ",
               shape_str(t->shape()), " ", dtype_name(t->dtype()), " must be contiguous (", rows,
               ") ", dtype_name(sd));
  }
}

template <typename T>
const T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr;
}
template <typename T>
T* mut_ptr(Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

// Forward of all three ops; r and s are undefined except for the residual form, mean for RMSNorm.
void norm_forward_any(const char* op, const Tensor& x, const Tensor& r, const Tensor& weight,
                      const Tensor& bias, double eps, Tensor& s, Tensor& y, Tensor& mean,
                      Tensor& rstd, bool center) {
  int64_t rows = 0, cols = 0;
  check_norm(op, x, {&r, &s, &y}, {&weight, &bias}, {&mean, &rstd}, rows, cols);
  LOOM_CHECK(weight.defined() && y.defined() && rstd.defined() && (!center || mean.defined()), op,
             ": missing weight or output");
  if (rows == 0) return;
  CudaDeviceGuard guard(x.device().index);
  LOOM_CUDA_DISPATCH_FLOAT(x.dtype(), op, [&] {
    using T = scalar_t;
    NormForwardArgs<T> a{};
    a.x = ptr<T>(x);
    a.r = ptr<T>(r);
    a.w = ptr<T>(weight);
    a.b = ptr<T>(bias);
    a.s = mut_ptr<T>(s);
    a.y = mut_ptr<T>(y);
    a.mean = mean.defined() ? static_cast<StatT<T>*>(mean.raw_data()) : nullptr;
    a.rstd = static_cast<StatT<T>*>(rstd.raw_data());
    a.rows = rows;
    a.cols = cols;
    a.eps = eps;
    a.center = center;
    norm_forward(a);
  });
}

// Backward of all three ops; ds is undefined except for the residual form, mean and dbias may be.
void norm_backward_any(const char* op, const Tensor& dy, const Tensor& ds, const Tensor& x,
                       const Tensor& weight, const Tensor& mean, const Tensor& rstd, Tensor& dx,
                       Tensor& dweight, Tensor& dbias, bool center) {
  int64_t rows = 0, cols = 0;
  check_norm(op, x, {&dy, &ds, &dx}, {&weight, &dweight, &dbias}, {&mean, &rstd}, rows, cols);
  LOOM_CHECK(weight.defined() && dy.defined() && dx.defined() && dweight.defined() &&
                 rstd.defined() && (!center || mean.defined()),
             op, ": missing input or output");
  if (rows == 0) return;
  CudaDeviceGuard guard(x.device().index);
  LOOM_CUDA_DISPATCH_FLOAT(x.dtype(), op, [&] {
    using T = scalar_t;
    NormBackwardArgs<T> a{};
    a.dy = ptr<T>(dy);
    a.ds = ptr<T>(ds);
    a.x = ptr<T>(x);
    a.w = ptr<T>(weight);
    a.mean = mean.defined() ? static_cast<const StatT<T>*>(mean.raw_data()) : nullptr;
    a.rstd = static_cast<const StatT<T>*>(rstd.raw_data());
    a.dx = mut_ptr<T>(dx);
    a.rows = rows;
    a.cols = cols;
    a.parts = dbias.defined() ? 2 : 1;
    a.center = center;
    norm_backward(a, x.device().index, mut_ptr<T>(dweight), mut_ptr<T>(dbias));
  });
}

void layer_norm_forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                             Tensor& y, Tensor& mean, Tensor& rstd) {
  Tensor none;
  norm_forward_any("layer_norm_forward", x, Tensor(), weight, bias, eps, none, y, mean, rstd, true);
}

void layer_norm_backward_cuda(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                              Tensor& dbias) {
  norm_backward_any("layer_norm_backward", dy, Tensor(), x, weight, mean, rstd, dx, dweight, dbias,
                    true);
}

void rms_norm_forward_cuda(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                           Tensor& rstd) {
  Tensor none, no_mean;
  norm_forward_any("rms_norm_forward", x, Tensor(), weight, Tensor(), eps, none, y, no_mean, rstd,
                   false);
}

void rms_norm_backward_cuda(const Tensor& dy, const Tensor& x, const Tensor& weight,
                            const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  Tensor no_dbias;
  norm_backward_any("rms_norm_backward", dy, Tensor(), x, weight, Tensor(), rstd, dx, dweight,
                    no_dbias, false);
}

void residual_layer_norm_forward_cuda(const Tensor& x, const Tensor& r, const Tensor& weight,
                                      const Tensor& bias, double eps, Tensor& s, Tensor& y,
                                      Tensor& mean, Tensor& rstd) {
  LOOM_CHECK(r.defined() && s.defined(), "residual_layer_norm_forward: r and s are required");
  norm_forward_any("residual_layer_norm_forward", x, r, weight, bias, eps, s, y, mean, rstd, true);
}

void residual_layer_norm_backward_cuda(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                       const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                       Tensor& dx, Tensor& dweight, Tensor& dbias) {
  norm_backward_any("residual_layer_norm_backward", dy, ds, s, weight, mean, rstd, dx, dweight,
                    dbias, true);
}

}  // namespace

LOOM_REGISTER_KERNEL(layer_norm_forward, kCuda, layer_norm_forward_cuda);
LOOM_REGISTER_KERNEL(layer_norm_backward, kCuda, layer_norm_backward_cuda);
LOOM_REGISTER_KERNEL(rms_norm_forward, kCuda, rms_norm_forward_cuda);
LOOM_REGISTER_KERNEL(rms_norm_backward, kCuda, rms_norm_backward_cuda);
LOOM_REGISTER_KERNEL(residual_layer_norm_forward, kCuda, residual_layer_norm_forward_cuda);
LOOM_REGISTER_KERNEL(residual_layer_norm_backward, kCuda, residual_layer_norm_backward_cuda);

}  // namespace loom::kernels::cuda
