// kernels/cuda/attention_mma.cuh — the building blocks of the tensor-core attention kernels
// (attention_mma.cu, attention_mma_backward.cu): tile sizes and padded shared-memory layout,
// cp.async copies, ldmatrix loads, mma.sync m16n8k16 (bf16 / f16 inputs, f32 accumulators)
// and 16-bit packing. Device functions only (sm_80 and later); no kernels, no state. Included
// only by kernels/cuda/attention_mma*.cu.
//
// Note [mma fragments] (m16n8k16, lane = 4g + t): the A fragment (16×16) holds rows g and g+8,
// columns 2t, 2t+1 and 2t+8, 2t+9; B (16×8) holds k rows 2t, 2t+1, 2t+8, 2t+9 of column g; the
// f32 accumulator C (16×8) holds rows g and g+8, columns 2t, 2t+1. So the accumulators of two
// adjacent 8-column tiles, packed to 16 bits, are the A fragment of a 16-wide k step; a
// row-major (k rows, n columns) matrix in shared memory gives B with ldmatrix.trans, and a
// (n rows, k columns) one with plain ldmatrix.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace loom::kernels::cuda::mma {

constexpr int kBlockRows = 64;    // rows of a tile: query rows per block, keys per key tile
constexpr int kMmaThreads = 128;  // 4 warps × 16 query rows
constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory row stride in 16-bit elements: rows stay 16-byte aligned (cp.async, ldmatrix),
// and the 8 rows one ldmatrix reads start 4 banks apart, so they never conflict.
template <int D>
constexpr int kStride = D + 8;
template <int D>
constexpr int kTileElems = kBlockRows* kStride<D>;
constexpr int kNTiles = kBlockRows / 8;  // 8-wide column tiles of a 64-wide score tile

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared, asynchronously; zeros instead when !valid (src is then not read).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8×8 b16 matrices; lanes 8i…8i+7 give the row addresses of matrix i, and r[i] receives
// the lane's (row lane/4, columns 2·(lane%4), +1) of matrix i (transposed with `trans`).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// c (16×8, f32) += a (16×16) · b (16×8), 16-bit inputs of T's format.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two f32 values rounded to nearest-even into T's format, lo in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, BFloat16>) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

// Starts the copy of a tile of `Rows` rows: rows [0, valid) of src (row stride D) into dst
// (row stride kStride<D>); rows from `valid` on become zeros, so masked keys never multiply
// garbage (src itself is then passed but not read).
template <int D, int Rows = kBlockRows>
__device__ __forceinline__ void load_tile_async(uint16_t* dst, const uint16_t* src, int64_t valid) {
  constexpr int kVecsPerRow = D / 8;  // 16-byte pieces
  constexpr int kIters = Rows * kVecsPerRow / kMmaThreads;
  static_assert(Rows * kVecsPerRow % kMmaThreads == 0, "tile must split evenly");
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int idx = it * kMmaThreads + static_cast<int>(threadIdx.x);
    const int r = idx / kVecsPerRow, c = (idx % kVecsPerRow) * 8;
    const bool ok = r < valid;
    cp_async_16(smem_addr(dst + r * kStride<D> + c), ok ? src + r * D + c : src, ok);
  }
}

// A fragments of the warp's 16 rows of a (64, kStride<D>) shared tile (Note [mma fragments]).
template <int D>
__device__ __forceinline__ void load_a_fragments(uint32_t (&f)[D / 16][4], const uint16_t* tile,
                                                 int warp, int lane) {
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    ldmatrix_x4(f[kc],
                smem_addr(tile + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride<D> +
                          kc * 16 + (lane >> 4) * 8));
  }
}

// acc (16 × 64) = A (the warp's 16 rows × D, fragments) · tileᵀ, where tile is (64 rows, D)
// in shared memory: the (n rows, k columns) B operand.
template <typename T, int D>
__device__ __forceinline__ void mma_abt(float (&acc)[kNTiles][4], const uint32_t (&a)[D / 16][4],
                                        const uint16_t* tile, int lane) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
  }
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t bf[4];
      ldmatrix_x4(bf, smem_addr(tile + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kStride<D> +
                                kc * 16 + ((lane >> 3) & 1) * 8));
      mma_16816<T>(acc[2 * np], a[kc], bf[0], bf[1]);
      mma_16816<T>(acc[2 * np + 1], a[kc], bf[2], bf[3]);
    }
  }
}

// out (16 × D) += P (16 × 64, f32 accumulators of a 64-wide product, rounded to T's format) ·
// tile, where tile is (64 rows, D) in shared memory: the row-major B operand, read transposed.
template <typename T, int D>
__device__ __forceinline__ void mma_pb(float (&out)[D / 8][4], const float (&p)[kNTiles][4],
                                       const uint16_t* tile, int lane) {
#pragma unroll
  for (int kk = 0; kk < kBlockRows / 16; ++kk) {
    const uint32_t pa[4] = {
        pack2<T>(p[2 * kk][0], p[2 * kk][1]), pack2<T>(p[2 * kk][2], p[2 * kk][3]),
        pack2<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack2<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t bf[4];
      ldmatrix_x4_trans(
          bf, smem_addr(tile + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride<D> +
                        dp * 16 + (lane >> 4) * 8));
      mma_16816<T>(out[2 * dp], pa, bf[0], bf[1]);
      mma_16816<T>(out[2 * dp + 1], pa, bf[2], bf[3]);
    }
  }
}

}  // namespace loom::kernels::cuda::mma
