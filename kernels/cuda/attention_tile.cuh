// kernels/cuda/attention_tile.cuh — the pieces the general (f32-math, shared-memory tiled)
// attention kernels share: kernels/cuda/attention.cu (causal attention) and
// kernels/cuda/attention_block.cu (ring attention's blocks). A block runs 4 warps; a lane owns
// head-size columns lane + 32·c (c < kChunks, D ≤ 128); rows are staged in shared memory as
// f32, key/query tiles of 32 rows spread one per lane. Device helpers and host launch
// arithmetic only: no kernels, no state.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "core/error.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/dtype_convert.cuh"

namespace loom::kernels::cuda {

constexpr int kThreads = 128;  // every general attention kernel runs 4 warps per block
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kMaxD = 128;
constexpr int kChunks = kMaxD / kWarpSize;  // a lane owns columns lane + 32·c, c < kChunks
constexpr int kKeyTile = 32;                // rows spread one per lane (keys, or queries in dk/dv)

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Σ_c a[c]·b[c] over n floats (shared memory).
__device__ __forceinline__ float dot_smem(const float* a, const float* b, int n) {
  float acc = 0.f;
  for (int c = 0; c < n; ++c) acc = fmaf(a[c], b[c], acc);
  return acc;
}

// Stages rows [r0, r0 + rows) of a (t, d) matrix in shared memory as f32 with row stride
// `stride`; rows at or past t become zeros (so masked products never meet garbage).
template <typename T>
__device__ void load_rows(float* dst, int stride, const T* src, int64_t r0, int rows, int64_t t,
                          int d) {
  for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
    const int r = idx / d, c = idx % d;
    const int64_t row = r0 + r;
    dst[r * stride + c] = row < t ? convert<float>(src[row * d + c]) : 0.f;
  }
}

// dst (d) += scale · acc, a lane's columns only; dst's old value widened to f32 and rounded back.
template <typename T>
__device__ __forceinline__ void accumulate_row(T* dst, const float (&acc)[kChunks], float scale,
                                               int d, int lane) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int col = lane + kWarpSize * c;
    if (col < d) dst[col] = convert<T>(convert<float>(dst[col]) + scale * acc[c]);
  }
}

// Blocks for `tiles` tiles of each of `groups` (batch, head) pairs, as a 1-d grid.
inline unsigned attention_grid(int64_t groups, int64_t tiles, const char* name) {
  const int64_t blocks = groups * tiles;
  LOOM_CHECK(blocks <= std::numeric_limits<int32_t>::max(), name, ": ", blocks,
             " blocks exceed the grid limit");
  return static_cast<unsigned>(blocks);
}

// Shared memory of `wide_rows` rows of stride d + 1 (lane-strided rows hit distinct banks) and
// `narrow_rows` rows of stride d, all f32. Each kernel file static_asserts that its launches fit
// kDefaultDynamicSmem at d = kMaxD (the launchers refuse larger heads), so none needs the opt-in.
constexpr size_t attention_smem_bytes(int64_t wide_rows, int64_t narrow_rows, int64_t d) {
  return static_cast<size_t>(wide_rows * (d + 1) + narrow_rows * d) * sizeof(float);
}

}  // namespace loom::kernels::cuda
