// kernels/cuda/attention_mma.cu — the tensor-core causal attention forward for bf16 and f16
// with D = 64 or 128 (Note [Attention kernel contract] in kernels/attention.h), FA2-style:
// a block owns 64 query rows (16 per warp), keeps them in registers as mma A fragments, and
// walks the 64-key tiles of K and V up to the diagonal, double-buffered in shared memory with
// cp.async. Scores and the output accumulate in f32 through mma.sync m16n8k16; the online
// softmax (running max and sum per row) runs in f32 in the log2 domain. Nothing T×T is stored.
// The launcher (attention.cu) calls this only when attention_forward_mma_supported() holds;
// this file registers nothing and must not synchronise the host. See docs/cuda_attention.md.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"

namespace loom::kernels::cuda {
namespace {

using namespace mma;  // NOLINT(build/namespaces): the tensor-core building blocks

// Q, two K buffers, two V buffers.
template <int D>
constexpr size_t kSmemBytes = 5 * kTileElems<D> * sizeof(uint16_t);

// One tile of the online softmax for the thread's two rows (rows[r], accumulator elements
// 2r, 2r + 1): scales the scores sc into the log2 domain, masks keys after the row (causal) or
// past T when `edge`, updates the running max m and sum l (a per-thread partial sum, reduced
// over the quad at the end), rescales o and leaves the probabilities in sc.
template <int D>
__device__ __forceinline__ void softmax_tile(float (&sc)[kNTiles][4], float (&m)[2], float (&l)[2],
                                             float (&o)[D / 8][4], const int64_t (&rows)[2],
                                             int64_t k0, int64_t t, bool edge, float scale_log2,
                                             int tq) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t key = k0 + nt * 8 + 2 * tq + (e & 1);
      float x = sc[nt][e] * scale_log2;
      if (edge && (key > rows[e >> 1] || key >= t)) x = -INFINITY;
      sc[nt][e] = x;
    }
  }
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    mx[0] = fmaxf(mx[0], fmaxf(sc[nt][0], sc[nt][1]));
    mx[1] = fmaxf(mx[1], fmaxf(sc[nt][2], sc[nt][3]));
  }
  float base[2], alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // the quad (lanes 4g … 4g + 3) holds the row
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 2));
    base[r] = mx[r] == -INFINITY ? 0.f : mx[r];  // a row with nothing unmasked yet stays zero
    alpha[r] = exp2f(m[r] - base[r]);
    m[r] = mx[r];
  }
  float row_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sc[nt][e] = exp2f(sc[nt][e] - base[e >> 1]);
      row_sum[e >> 1] += sc[nt][e];
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + row_sum[r];
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) {
    o[dn][0] *= alpha[0];
    o[dn][1] *= alpha[0];
    o[dn][2] *= alpha[1];
    o[dn][3] *= alpha[1];
  }
}

// One block per (b, h, tile of 64 query rows), heaviest (last) tiles first. Thread (warp w,
// lane = 4g + t) holds query rows 16w + g and 16w + g + 8 of the tile: m16n8k16 fragments.
template <typename T, int D>
__global__ void __launch_bounds__(kMmaThreads)
    attention_forward_mma_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                                 const uint16_t* __restrict__ v, uint16_t* __restrict__ out,
                                 float* __restrict__ lse, AttnShape s, float scale_log2,
                                 int64_t q_tiles) {
  extern __shared__ __align__(16) unsigned char mma_smem[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(mma_smem);  // (64, kStride)
  uint16_t* ks = qs + kTileElems<D>;                      // 2 × (64, kStride)
  uint16_t* vs = ks + 2 * kTileElems<D>;                  // 2 × (64, kStride)

  const int64_t tile = q_tiles - 1 - static_cast<int64_t>(blockIdx.x) % q_tiles;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) / q_tiles;  // b·Hq + h
  const int64_t kv = (bh / s.hq) * s.hkv + (bh % s.hq) / s.group;
  const int64_t t = s.t;
  const int64_t q0 = tile * kBlockRows, q_end = min64(q0 + kBlockRows, t);
  const int64_t n_key_tiles = (q_end + kBlockRows - 1) / kBlockRows;  // keys < q_end
  const uint16_t* kb = k + kv * t * D;
  const uint16_t* vb = v + kv * t * D;
  load_tile_async<D>(qs, q + (bh * t + q0) * D, q_end - q0);
  load_tile_async<D>(ks, kb, min64(kBlockRows, t));
  load_tile_async<D>(vs, vb, min64(kBlockRows, t));
  cp_async_commit();

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int tq = lane & 3;
  const int64_t warp_row0 = q0 + warp * 16;
  const int64_t rows[2] = {warp_row0 + (lane >> 2), warp_row0 + (lane >> 2) + 8};
  uint32_t qf[D / 16][4];
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int64_t kt = 0; kt < n_key_tiles; ++kt) {
    const int buf = static_cast<int>(kt & 1);
    if (kt + 1 < n_key_tiles) {  // prefetch the next tile into the other buffer
      const int64_t next = (kt + 1) * kBlockRows;
      load_tile_async<D>(ks + (buf ^ 1) * kTileElems<D>, kb + next * D, min64(kBlockRows, t - next));
      load_tile_async<D>(vs + (buf ^ 1) * kTileElems<D>, vb + next * D, min64(kBlockRows, t - next));
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this tile (and, at kt = 0, Q) is in shared memory for every thread
    if (kt == 0) load_a_fragments<D>(qf, qs, warp, lane);

    float sc[kNTiles][4];  // S: the warp's 16 rows × 64 keys
    mma_abt<T, D>(sc, qf, ks + buf * kTileElems<D>, lane);
    const int64_t k0 = kt * kBlockRows;
    const bool edge = k0 + kBlockRows - 1 > warp_row0 || k0 + kBlockRows > t;
    softmax_tile<D>(sc, m, l, o, rows, k0, t, edge, scale_log2, tq);
    mma_pb<T, D>(o, sc, vs + buf * kTileElems<D>, lane);  // O += P V
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(kFullMask, l[r], 1);
    l[r] += __shfl_xor_sync(kFullMask, l[r], 2);
  }
  const float inv[2] = {1.f / l[0], 1.f / l[1]};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= t) continue;
    uint16_t* orow = out + (bh * t + rows[r]) * D;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      *reinterpret_cast<uint32_t*>(orow + dn * 8 + 2 * tq) =
          pack2<T>(o[dn][2 * r] * inv[r], o[dn][2 * r + 1] * inv[r]);
    }
    if (tq == 0) lse[bh * t + rows[r]] = (m[r] + log2f(l[r])) * kLn2;
  }
}

bool aligned16(const Tensor& x) { return reinterpret_cast<uintptr_t>(x.raw_data()) % 16 == 0; }

template <typename T, int D>
void launch_forward_mma(const Tensor& q, const Tensor& k, const Tensor& v, const AttnShape& s,
                        float scale, Tensor& out, Tensor& lse) {
  const auto kernel = attention_forward_mma_kernel<T, D>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kSmemBytes<D>)));
  const int64_t q_tiles = (s.t + kBlockRows - 1) / kBlockRows;
  const int64_t blocks = s.b * s.hq * q_tiles;
  LOOM_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "attention_forward: ", blocks,
             " blocks exceed the grid limit");
  kernel<<<static_cast<unsigned>(blocks), kMmaThreads, kSmemBytes<D>, compute_stream()>>>(
      static_cast<const uint16_t*>(q.raw_data()), static_cast<const uint16_t*>(k.raw_data()),
      static_cast<const uint16_t*>(v.raw_data()), static_cast<uint16_t*>(out.raw_data()),
      lse.data<float>(), s, scale * kLog2e, q_tiles);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <typename T>
void forward_mma_typed(const Tensor& q, const Tensor& k, const Tensor& v, const AttnShape& s,
                       float scale, Tensor& out, Tensor& lse) {
  if (s.d == 64) {
    launch_forward_mma<T, 64>(q, k, v, s, scale, out, lse);
  } else {
    launch_forward_mma<T, 128>(q, k, v, s, scale, out, lse);
  }
}

}  // namespace

bool attention_forward_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const AttnShape& s) {
  return (q.dtype() == DType::kBF16 || q.dtype() == DType::kF16) && (s.d == 64 || s.d == 128) &&
         aligned16(q) && aligned16(k) && aligned16(v) && aligned16(out);
}

void attention_forward_mma(const Tensor& q, const Tensor& k, const Tensor& v, const AttnShape& s,
                           float scale, Tensor& out, Tensor& lse) {
  LOOM_CHECK(attention_forward_mma_supported(q, k, v, out, s),
             "attention_forward: the tensor-core path does not take this call");
  if (q.dtype() == DType::kBF16) {
    forward_mma_typed<BFloat16>(q, k, v, s, scale, out, lse);
  } else {
    forward_mma_typed<Float16>(q, k, v, s, scale, out, lse);
  }
}

}  // namespace loom::kernels::cuda
