// kernels/cuda/vec_map.cuh — the element-wise machinery shared by the CUDA element-wise,
// activation, dropout and AdamW kernels: the compute type (f32 for f32/bf16/f16, f64 for f64),
// 16-byte packs, a float-dtype dispatch, the strided N-tensor walk, and map_kernel: a grid-stride
// loop over packs of V elements of NIn contiguous inputs and NOut contiguous outputs, with
// vector loads/stores where every pointer is pack-aligned and a scalar path for the tail and for
// unaligned views. Holds no state and launches nothing on its own; launchers stay in the .cu
// files that use it. Conversions go through dtype_convert.cuh (the CPU's rounding).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/dtype_convert.cuh"

// clang-format off
// (a table: one line per dtype case)
// LOOM_CUDA_DISPATCH_FLOAT(dtype, name, body): body with `scalar_t` bound to float, double,
// loom::BFloat16 or loom::Float16; any other dtype is an error naming the op.
#define LOOM_CUDA_DISPATCH_FLOAT(dtype, opname, ...)               \
  [&] {                                                            \
    switch (dtype) {                                               \
      case ::loom::DType::kF32: {                                  \
        using scalar_t = float;                                    \
        return __VA_ARGS__();                                      \
      }                                                            \
      case ::loom::DType::kF64: {                                  \
        using scalar_t = double;                                   \
        return __VA_ARGS__();                                      \
      }                                                            \
      case ::loom::DType::kBF16: {                                 \
        using scalar_t = ::loom::BFloat16;                         \
        return __VA_ARGS__();                                      \
      }                                                            \
      case ::loom::DType::kF16: {                                  \
        using scalar_t = ::loom::Float16;                          \
        return __VA_ARGS__();                                      \
      }                                                            \
      default:                                                     \
        LOOM_FAIL(opname, ": dtype ", ::loom::dtype_name(dtype),   \
                  " not supported on cuda (f32, f64, bf16, f16)"); \
    }                                                              \
  }()
// clang-format on

namespace loom::kernels::cuda {

constexpr unsigned kMapThreads = 256;  // map kernels' block (their __launch_bounds__)

// Arithmetic type for a storage type: 16-bit floats compute in f32.
template <typename T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Elements per 16-byte pack.
template <typename T>
inline constexpr int kPackOf = static_cast<int>(16 / sizeof(T));

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Products and sums rounded once, never contracted into an FMA: where the CPU kernel's result
// cannot be contracted either (dropout's masked product, embedding sums), the CUDA kernel then
// gives the CPU's bits; elsewhere the two agree to about an ulp.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }

template <int NIn, int NOut, typename T>
struct MapPtrs {
  const T* in[NIn > 0 ? NIn : 1] = {};
  T* out[NOut] = {};
};

// f.template apply<V>(first, x, y): x[a][j] is input a at element first + j, y[b][j] output b
// (its current value when F::kReadsOut, else 0). Lanes at or past n hold 0 and are not stored.
// `first` is a multiple of V.
template <typename T, int V, int NIn, int NOut, typename F>
__global__ void __launch_bounds__(kMapThreads)
    map_kernel(MapPtrs<NIn, NOut, T> p, int64_t n, bool aligned, F f) {
  using C = compute_t<T>;
  using P = Pack<T, V>;
  const int64_t packs = (n + V - 1) / V;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < packs;
       k += step) {
    const int64_t first = k * V;
    const bool full = aligned && first + V <= n;
    C x[NIn > 0 ? NIn : 1][V];
    C y[NOut][V];
#pragma unroll
    for (int a = 0; a < NIn; ++a) {
      if (full) {
        const P pk = *reinterpret_cast<const P*>(p.in[a] + first);
#pragma unroll
        for (int j = 0; j < V; ++j) x[a][j] = convert<C>(pk.v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) x[a][j] = first + j < n ? convert<C>(p.in[a][first + j]) : C(0);
      }
    }
#pragma unroll
    for (int b = 0; b < NOut; ++b) {
      if constexpr (F::kReadsOut) {
        if (full) {
          const P pk = *reinterpret_cast<const P*>(p.out[b] + first);
#pragma unroll
          for (int j = 0; j < V; ++j) y[b][j] = convert<C>(pk.v[j]);
        } else {
#pragma unroll
          for (int j = 0; j < V; ++j) {
            y[b][j] = first + j < n ? convert<C>(p.out[b][first + j]) : C(0);
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) y[b][j] = C(0);
      }
    }
    f.template apply<V>(first, x, y);
#pragma unroll
    for (int b = 0; b < NOut; ++b) {
      if (full) {
        P pk;
#pragma unroll
        for (int j = 0; j < V; ++j) pk.v[j] = convert<T>(y[b][j]);
        *reinterpret_cast<P*>(p.out[b] + first) = pk;
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (first + j < n) p.out[b][first + j] = convert<T>(y[b][j]);
        }
      }
    }
  }
}

template <int NIn, int NOut, typename T>
bool packs_aligned(const MapPtrs<NIn, NOut, T>& p, size_t pack_bytes) {
  for (int a = 0; a < NIn; ++a) {
    if (reinterpret_cast<uintptr_t>(p.in[a]) % pack_bytes != 0) return false;
  }
  for (int b = 0; b < NOut; ++b) {
    if (reinterpret_cast<uintptr_t>(p.out[b]) % pack_bytes != 0) return false;
  }
  return true;
}

// Runs f over n contiguous elements on the compute stream (the caller holds a CudaDeviceGuard).
template <typename T, int V = kPackOf<T>, int NIn, int NOut, typename F>
void launch_map(const MapPtrs<NIn, NOut, T>& p, int64_t n, const F& f) {
  if (n <= 0) return;
  const bool aligned = packs_aligned(p, sizeof(Pack<T, V>));
  const int64_t packs = (n + V - 1) / V;
  map_kernel<T, V, NIn, NOut, F>
      <<<grid_for(packs, kMapThreads), kMapThreads, 0, compute_stream()>>>(p, n, aligned, f);
  LOOM_CUDA_LAUNCH_CHECK();
}

// ---- strided walks --------------------------------------------------------------------------

constexpr int kMaxStridedDims = 8;

// N tensors of one logical shape, each with its own strides (elements), dims coalesced where
// every tensor allows it. Passed to kernels by value.
template <int N>
struct StridedWalk {
  int ndim = 0;
  int64_t shape[kMaxStridedDims] = {};
  int64_t stride[N][kMaxStridedDims] = {};
};

template <int N>
StridedWalk<N> make_strided_walk(const Shape& shape, const std::array<const Shape*, N>& strides,
                                 const char* op) {
  struct Dim {
    int64_t size;
    std::array<int64_t, N> st;
  };
  std::vector<Dim> dims;  // innermost first
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    Dim d{shape[i], {}};
    for (int t = 0; t < N; ++t) d.st[t] = (*strides[t])[i];
    bool merge = !dims.empty();
    for (int t = 0; t < N && merge; ++t) merge = d.st[t] == dims.back().st[t] * dims.back().size;
    if (merge) {
      dims.back().size *= d.size;
    } else {
      dims.push_back(d);
    }
  }
  LOOM_CHECK(dims.size() <= static_cast<size_t>(kMaxStridedDims), op,
             ": cuda kernel handles at most ", kMaxStridedDims, " non-mergeable dims, got ",
             dims.size(), " for shape ", shape_str(shape));
  StridedWalk<N> w;
  w.ndim = static_cast<int>(dims.size());
  for (int d = 0; d < w.ndim; ++d) {
    const Dim& dim = dims[static_cast<size_t>(w.ndim - 1 - d)];
    w.shape[d] = dim.size;
    for (int t = 0; t < N; ++t) w.stride[t][d] = dim.st[t];
  }
  return w;
}

// Element offsets of logical (row-major) index i in each of the N tensors.
template <int N>
__device__ __forceinline__ void strided_offsets(int64_t i, const StridedWalk<N>& w,
                                                int64_t (&off)[N]) {
#pragma unroll
  for (int t = 0; t < N; ++t) off[t] = 0;
#pragma unroll
  for (int d = kMaxStridedDims - 1; d >= 0; --d) {
    if (d >= w.ndim) continue;
    const int64_t idx = i % w.shape[d];
    i /= w.shape[d];
#pragma unroll
    for (int t = 0; t < N; ++t) off[t] += idx * w.stride[t][d];
  }
}

// map_kernel's contract (V = 1) over strided tensors: walk strides are inputs first, then outputs.
template <typename T, int NIn, int NOut, typename F>
__global__ void __launch_bounds__(kMapThreads)
    strided_map_kernel(MapPtrs<NIn, NOut, T> p, int64_t n, StridedWalk<NIn + NOut> w, F f) {
  using C = compute_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[NIn + NOut];
    strided_offsets(i, w, off);
    C x[NIn > 0 ? NIn : 1][1];
    C y[NOut][1];
#pragma unroll
    for (int a = 0; a < NIn; ++a) x[a][0] = convert<C>(p.in[a][off[a]]);
#pragma unroll
    for (int b = 0; b < NOut; ++b) {
      y[b][0] = F::kReadsOut ? convert<C>(p.out[b][off[NIn + b]]) : C(0);
    }
    f.template apply<1>(i, x, y);
#pragma unroll
    for (int b = 0; b < NOut; ++b) p.out[b][off[NIn + b]] = convert<T>(y[b][0]);
  }
}

template <typename T, int NIn, int NOut, typename F>
void launch_strided_map(const MapPtrs<NIn, NOut, T>& p, const Shape& shape,
                        const std::array<const Shape*, NIn + NOut>& strides, const F& f,
                        const char* op) {
  const int64_t n = shape_numel(shape);
  if (n <= 0) return;
  const StridedWalk<NIn + NOut> w = make_strided_walk<NIn + NOut>(shape, strides, op);
  strided_map_kernel<T, NIn, NOut, F>
      <<<grid_for(n, kMapThreads), kMapThreads, 0, compute_stream()>>>(p, n, w, f);
  LOOM_CUDA_LAUNCH_CHECK();
}

// ---- argument checks ------------------------------------------------------------------------

// Every tensor has ref's shape and dtype, lives on ref's device, and is contiguous.
inline void check_same_contiguous(const char* op, const Tensor& ref,
                                  std::initializer_list<const Tensor*> others) {
  LOOM_CHECK(ref.is_contiguous(), op, ": cuda kernel needs contiguous tensors");
  for (const Tensor* t : others) {
    LOOM_CHECK(t->shape() == ref.shape(), op, ": shape ", shape_str(t->shape()), " differs from ",
               shape_str(ref.shape()));
    LOOM_CHECK(t->dtype() == ref.dtype(), op, ": dtype ", dtype_name(t->dtype()), " differs from ",
               dtype_name(ref.dtype()));
    LOOM_CHECK(t->device() == ref.device(), op, ": tensors on ", t->device().str(), " and ",
               ref.device().str());
    LOOM_CHECK(t->is_contiguous(), op, ": cuda kernel needs contiguous tensors");
  }
}

}  // namespace loom::kernels::cuda
