// kernels/cuda/block_reduce.cuh — warp and block reductions (sum, max) for the row-wise CUDA
// kernels (norm.cu, softmax.cu). Every thread gets the same result bits: warps reduce by an xor
// butterfly (each step adds the same two values on both lanes) and blocks add the warp totals in
// warp order. Device code only; holds no state and must not allocate or synchronise the host.
#pragma once

#include <cuda_runtime.h>

namespace loom::kernels::cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

template <typename A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) {
    const A other = __shfl_xor_sync(kFullMask, v, o);
    v = other > v ? other : v;
  }
  return v;
}

// Sums K values per thread over the whole block; every thread gets the totals. blockDim.x must
// be a multiple of 32 (at most 1024) and every thread of the block must call it (it contains
// __syncthreads). scratch: shared memory for 32·K values, reusable by the next call: the leading
// barrier keeps a fast warp from overwriting totals that a slow warp is still reading.
template <int K, typename A>
__device__ __forceinline__ void block_sum(A (&v)[K], A* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = warp_sum(v[k]);
  __syncthreads();
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) scratch[k * kWarpSize + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    A t = scratch[k * kWarpSize];
    for (int w = 1; w < warps; ++w) t += scratch[k * kWarpSize + w];
    v[k] = t;
  }
}

template <typename A>
__device__ __forceinline__ A block_sum(A v, A* scratch) {
  A a[1] = {v};
  block_sum<1>(a, scratch);
  return a[0];
}

// The block's maximum; same calling rules as block_sum (scratch: 32 values).
template <typename A>
__device__ __forceinline__ A block_max(A v, A* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  A t = scratch[0];
  for (int w = 1; w < warps; ++w) t = scratch[w] > t ? scratch[w] : t;
  return t;
}

}  // namespace loom::kernels::cuda
