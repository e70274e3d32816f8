// kernels/cuda/row_io.cuh — what the row-wise CUDA kernels (norm.cu, softmax.cu, rope.cu) share:
// the compute type of each storage dtype, packed loads/stores (16 bytes at a time on aligned
// rows, one element otherwise), the per-thread row cache layout and the host-side launch
// arithmetic (block size, shared-memory budget). Holds no state; must not allocate.
//
// Note [Row cache]: a row kernel reads each row from global memory once and keeps the values
// (in the compute type) in dynamic shared memory for its later passes. Thread j owns packs
// j, j + blockDim, … of the row in every pass, so each cached value is written and read by the
// same thread: the cache needs no barriers. Value k of pack p sits at cache[k·P + p] (P packs per
// row), so a warp's accesses hit consecutive banks. When the row does not fit in the budget the
// kernel re-reads global memory instead (same results, more traffic).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/dtype_convert.cuh"

namespace loom::kernels::cuda {

// Compute type: f64 for f64 storage, f32 for f32, bf16 and f16.
template <typename T>
using AccT = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Elements per 16-byte pack.
template <typename T>
inline constexpr int kPackWidth = static_cast<int>(16 / sizeof(T));

// out[k] = p[k] for k < W, widened to the compute type. W is 1 or kPackWidth<T> (then p must be
// 16-byte aligned).
template <int W, typename T>
__device__ __forceinline__ void load_pack(const T* p, AccT<T> (&out)[W]) {
  if constexpr (W == 1) {
    out[0] = convert<AccT<T>>(p[0]);
  } else {
    static_assert(W * sizeof(T) == 16, "a pack is 16 bytes");
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    T vals[W];
    memcpy(vals, &raw, sizeof(raw));
#pragma unroll
    for (int k = 0; k < W; ++k) out[k] = convert<AccT<T>>(vals[k]);
  }
}

// p[k] = in[k] for k < W, rounded to T (same alignment rule as load_pack).
template <int W, typename T>
__device__ __forceinline__ void store_pack(T* p, const AccT<T> (&in)[W]) {
  if constexpr (W == 1) {
    p[0] = convert<T>(in[0]);
  } else {
    static_assert(W * sizeof(T) == 16, "a pack is 16 bytes");
    T vals[W];
#pragma unroll
    for (int k = 0; k < W; ++k) vals[k] = convert<T>(in[k]);
    uint4 raw;
    memcpy(&raw, vals, sizeof(raw));
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

// v rounded to T and widened back (what storing and reloading it would give).
template <typename T>
__device__ __forceinline__ AccT<T> round_to(AccT<T> v) {
  return convert<AccT<T>>(convert<T>(v));
}

// ---- host side ----

// True when every pointer is 16-byte aligned (null pointers count as aligned).
inline bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Largest block a row kernel is launched with (its __launch_bounds__).
constexpr int kRowMaxThreads = 512;

// Threads for a row of `packs` packs, about `per_thread` packs each: a multiple of 32 in
// [64, kRowMaxThreads].
inline int row_threads(int64_t packs, int64_t per_thread) {
  int64_t t = (packs + per_thread - 1) / per_thread;
  t = (t + 31) / 32 * 32;
  if (t < 64) t = 64;
  if (t > kRowMaxThreads) t = kRowMaxThreads;
  return static_cast<int>(t);
}

// Room left for a row kernel's static shared memory (its reduction scratch, at most 512 B, and
// the 1 KiB sm_90 reserves per block) beside its dynamic shared memory.
constexpr size_t kStaticReserve = 2048;

// Dynamic shared memory a block may use on the current device, leaving kStaticReserve.
inline size_t dynamic_smem_limit() {
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return static_cast<size_t>(optin) > kStaticReserve ? static_cast<size_t>(optin) - kStaticReserve
                                                     : 0;
}

// Shared memory a row kernel may spend on its row cache: at most 96 KiB, so that two blocks still
// fit on an SM (an H100/H200 SM has 228 KiB).
inline size_t row_cache_budget() {
  constexpr size_t kBudget = 96 * 1024;
  const size_t limit = dynamic_smem_limit();
  return limit < kBudget ? limit : kBudget;
}

// Allows `kernel` to be launched with `bytes` of dynamic shared memory. Without the opt-in a
// block's static and dynamic shared memory together must fit the default 48 KiB, so a request
// within kStaticReserve of it opts in too (e.g. an f32 RMSNorm backward at C = 4096 asks for
// exactly 48 KiB of dynamic memory beside its static scratch).
template <typename Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes + kStaticReserve > kDefaultDynamicSmem) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)));
  }
}

// Grid size for a block-per-row loop (blocks stride over the rows beyond this).
inline unsigned row_grid(int64_t rows) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;
  return static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
}

}  // namespace loom::kernels::cuda

// clang-format off
// (a table: one line per dtype case)
// LOOM_CUDA_DISPATCH_FLOAT(dtype, name, body): `scalar_t` bound to the storage type of f32, f64,
// bf16 or f16 (the float dtypes the CUDA row kernels take); any other dtype is an error naming
// the op.
#define LOOM_CUDA_DISPATCH_FLOAT(dtype, opname, ...)                                             \
  [&] {                                                                                         \
    switch (dtype) {                                                                            \
      case ::loom::DType::kF32: { using scalar_t = float; return __VA_ARGS__(); }               \
      case ::loom::DType::kF64: { using scalar_t = double; return __VA_ARGS__(); }              \
      case ::loom::DType::kBF16: { using scalar_t = ::loom::BFloat16; return __VA_ARGS__(); }   \
      case ::loom::DType::kF16: { using scalar_t = ::loom::Float16; return __VA_ARGS__(); }     \
      default:                                                                                  \
        LOOM_FAIL(opname, ": dtype ", ::loom::dtype_name(dtype),                                \
                  " not supported on cuda (f32, f64, bf16, f16)");                              \
    }                                                                                           \
  }()
// clang-format on
