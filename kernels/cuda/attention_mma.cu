// kernels/cuda/attention_mma.cu — the tensor-core causal attention forward for bf16 and f16
// with D = 64 or 128 (Note [Attention kernel contract] in kernels/attention.h), FA2-style:
// a block owns 128 query rows at D = 64 (32 per warp) or 64 at D = 128 (16 per warp), keeps
// them in registers as mma A fragments, and walks the 64-key tiles of K and V up to the
// diagonal, double-buffered in shared memory with cp.async. Scores and the output accumulate in f32
// through mma.sync m16n8k16; the online softmax (running max and sum per row) runs in f32 in the
// log2 domain. With packed documents (Note [Packed documents] in kernels/attention.h; a separate
// instantiation, kDocs, so the plain kernel keeps its registers) a block starts at the key tile
// of its first row's document start, a warp skips the key tiles wholly before its rows'
// documents, and tiles a document boundary crosses are masked per element.
// Nothing T×T is stored. The launcher (attention.cu) calls this only when
// attention_forward_mma_supported() holds; this file registers nothing and must not synchronise the
// host. See docs/cuda_attention.md.
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

// Query rows per warp, in 16-row m tiles: two at D = 64 (each K and V fragment read from shared
// memory feeds two mma, halving shared-memory traffic per FLOP), one at D = 128 (registers).
template <int D>
constexpr int kMTiles = D == 64 ? 2 : 1;
template <int D>
constexpr int kQRows = 4 * 16 * kMTiles<D>;  // query rows per block (4 warps)
// Q, two K buffers, two V buffers.
template <int D>
constexpr size_t kSmemBytes = (kQRows<D> * kStride<D> + 4 * kTileElems<D>)*sizeof(uint16_t);
// 54 KiB at D = 64, 85 KiB at D = 128: above the default 48 KiB (the launcher opts in), within
// every built architecture's per-block limit.
static_assert(kSmemBytes<64> <= kMaxOptinSmem && kSmemBytes<128> <= kMaxOptinSmem,
              "the forward's shared memory must fit sm_80's per-block limit");

// acc[mt] (16 × 64) = A[mt] (16 rows × D) · tileᵀ for the warp's M m tiles; tile is (64 rows,
// D), the (n rows, k columns) B operand, each fragment loaded once for all m tiles.
template <typename T, int D, int M>
__device__ __forceinline__ void mma_abt_m(float (&acc)[M][kNTiles][4],
                                          const uint32_t (&a)[M][D / 16][4], const uint16_t* tile,
                                          int lane) {
#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
    }
  }
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t bf[4];
      ldmatrix_x4(bf, smem_addr(tile + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kStride<D> +
                                kc * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
      for (int mt = 0; mt < M; ++mt) {
        mma_16816<T>(acc[mt][2 * np], a[mt][kc], bf[0], bf[1]);
        mma_16816<T>(acc[mt][2 * np + 1], a[mt][kc], bf[2], bf[3]);
      }
    }
  }
}

// out[mt] (16 × D) += P[mt] (16 × 64, rounded to T's format) · tile for the warp's M m tiles;
// tile is (64 rows, D), the row-major B operand read transposed, each fragment loaded once.
template <typename T, int D, int M>
__device__ __forceinline__ void mma_pb_m(float (&out)[M][D / 8][4], const float (&p)[M][kNTiles][4],
                                         const uint16_t* tile, int lane) {
#pragma unroll
  for (int kk = 0; kk < kBlockRows / 16; ++kk) {
    uint32_t pa[M][4];
#pragma unroll
    for (int mt = 0; mt < M; ++mt) {
      pa[mt][0] = pack2<T>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      pa[mt][1] = pack2<T>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      pa[mt][2] = pack2<T>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      pa[mt][3] = pack2<T>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t bf[4];
      ldmatrix_x4_trans(
          bf, smem_addr(tile + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride<D> +
                        dp * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int mt = 0; mt < M; ++mt) {
        mma_16816<T>(out[mt][2 * dp], pa[mt], bf[0], bf[1]);
        mma_16816<T>(out[mt][2 * dp + 1], pa[mt], bf[2], bf[3]);
      }
    }
  }
}

// One tile of the online softmax for the thread's two rows (rows[r], accumulator elements
// 2r, 2r + 1): scales the scores sc into the log2 domain, masks keys after the row (causal),
// before its document (kDocs: doc_start of the row, read here, on edge tiles only, to spare
// registers) or past T when `edge`, updates the running max m and sum l (a per-thread partial
// sum, reduced over the quad at the end), rescales o and leaves the probabilities in sc.
template <int D, bool kDocs>
__device__ __forceinline__ void softmax_tile(float (&sc)[kNTiles][4], float (&m)[2], float (&l)[2],
                                             float (&o)[D / 8][4], const int64_t (&rows)[2],
                                             const int32_t* doc_start, int64_t k0, int64_t t,
                                             bool edge, float scale_log2, int tq) {
  int32_t lo[2] = {0, 0};  // the rows' first keys
  if (kDocs && edge) {
#pragma unroll
    for (int r = 0; r < 2; ++r) lo[r] = rows[r] < t ? doc_start[rows[r]] : 0;
  }
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t key = k0 + nt * 8 + 2 * tq + (e & 1);
      float x = sc[nt][e] * scale_log2;
      if (edge && (key > rows[e >> 1] || key >= t || (kDocs && key < lo[e >> 1]))) x = -INFINITY;
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

// One block per (b, h, tile of kQRows query rows), heaviest (last) tiles first. Warp w owns
// rows [16·M·w, 16·M·(w + 1)) of the tile as M m tiles; in m tile mt, thread lane = 4g + t
// holds rows 16·(M·w + mt) + g and + 8 (m16n8k16 fragments).
template <typename T, int D, bool kDocs>
__global__ void __launch_bounds__(kMmaThreads)
    attention_forward_mma_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                                 const uint16_t* __restrict__ v,
                                 const int32_t* __restrict__ doc_start, uint16_t* __restrict__ out,
                                 float* __restrict__ lse, AttnShape s, float scale_log2,
                                 int64_t q_tiles) {
  constexpr int M = kMTiles<D>;
  extern __shared__ __align__(16) unsigned char mma_smem[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(mma_smem);  // (kQRows, kStride)
  uint16_t* ks = qs + kQRows<D> * kStride<D>;            // 2 × (64, kStride)
  uint16_t* vs = ks + 2 * kTileElems<D>;                 // 2 × (64, kStride)

  const int64_t tile = q_tiles - 1 - static_cast<int64_t>(blockIdx.x) % q_tiles;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) / q_tiles;  // b·Hq + h
  const int64_t kv = (bh / s.hq) * s.hkv + (bh % s.hq) / s.group;
  const int64_t t = s.t;
  const int64_t q0 = tile * kQRows<D>, q_end = min64(q0 + kQRows<D>, t);
  const int64_t n_key_tiles = (q_end + kBlockRows - 1) / kBlockRows;  // keys < q_end
  // The first key tile any row sees: doc_start is non-decreasing, row q0 has the smallest.
  const int64_t kt_begin = kDocs ? doc_start[q0] / kBlockRows : 0;
  const uint16_t* kb = k + kv * t * D;
  const uint16_t* vb = v + kv * t * D;
  load_tile_async<D, kQRows<D>>(qs, q + (bh * t + q0) * D, q_end - q0);
  load_tile_async<D>(ks, kb + kt_begin * kBlockRows * D,
                     min64(kBlockRows, t - kt_begin * kBlockRows));
  load_tile_async<D>(vs, vb + kt_begin * kBlockRows * D,
                     min64(kBlockRows, t - kt_begin * kBlockRows));
  cp_async_commit();

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int tq = lane & 3;
  const int64_t warp_row0 = q0 + warp * 16 * M;
  int64_t rows[M][2];
  uint32_t qf[M][D / 16][4];
  float o[M][D / 8][4] = {};
  float m[M][2], l[M][2];
#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
    rows[mt][0] = warp_row0 + 16 * mt + (lane >> 2);
    rows[mt][1] = rows[mt][0] + 8;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
  }
  // The smallest and largest first key of the warp's rows (inside T): key tiles ending at or
  // before the smallest hold nothing the warp sees; tiles starting before the largest are masked.
  const int64_t warp_last = min64(warp_row0 + 16 * M, t) - 1;
  const int32_t warp_lo_min = kDocs && warp_row0 < t ? doc_start[warp_row0] : 0;
  const int32_t warp_lo_max = kDocs && warp_row0 < t ? doc_start[warp_last] : 0;

  for (int64_t kt = kt_begin; kt < n_key_tiles; ++kt) {
    const int buf = static_cast<int>((kt - kt_begin) & 1);
    if (kt + 1 < n_key_tiles) {  // prefetch the next tile into the other buffer
      const int64_t next = (kt + 1) * kBlockRows;
      load_tile_async<D>(ks + (buf ^ 1) * kTileElems<D>, kb + next * D,
                         min64(kBlockRows, t - next));
      load_tile_async<D>(vs + (buf ^ 1) * kTileElems<D>, vb + next * D,
                         min64(kBlockRows, t - next));
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this tile (and, at kt_begin, Q) is in shared memory for every thread
    if (kt == kt_begin) {
#pragma unroll
      for (int mt = 0; mt < M; ++mt) load_a_fragments<D>(qf[mt], qs, warp * M + mt, lane);
    }

    const int64_t k0 = kt * kBlockRows;
    if (!kDocs || k0 + kBlockRows > warp_lo_min) {  // warp-uniform: else the warp sees none
      float sc[M][kNTiles][4];                      // S: the warp's m tiles × 64 keys
      mma_abt_m<T, D, M>(sc, qf, ks + buf * kTileElems<D>, lane);
      const bool edge =
          k0 + kBlockRows - 1 > warp_row0 || k0 + kBlockRows > t || (kDocs && k0 < warp_lo_max);
#pragma unroll
      for (int mt = 0; mt < M; ++mt) {
        softmax_tile<D, kDocs>(sc[mt], m[mt], l[mt], o[mt], rows[mt], doc_start, k0, t, edge,
                               scale_log2, tq);
      }
      mma_pb_m<T, D, M>(o, sc, vs + buf * kTileElems<D>, lane);  // O += P V
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[mt][r];
      sum += __shfl_xor_sync(kFullMask, sum, 1);
      sum += __shfl_xor_sync(kFullMask, sum, 2);
      if (rows[mt][r] >= t) continue;
      const float inv = 1.f / sum;
      uint16_t* orow = out + (bh * t + rows[mt][r]) * D;
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        *reinterpret_cast<uint32_t*>(orow + dn * 8 + 2 * tq) =
            pack2<T>(o[mt][dn][2 * r] * inv, o[mt][dn][2 * r + 1] * inv);
      }
      if (tq == 0) lse[bh * t + rows[mt][r]] = (m[mt][r] + log2f(sum)) * kLn2;
    }
  }
}

template <typename T, int D>
void launch_forward_mma(const Tensor& q, const Tensor& k, const Tensor& v, const int32_t* doc_start,
                        const AttnShape& s, float scale, Tensor& out, Tensor& lse) {
  const auto kernel = doc_start ? attention_forward_mma_kernel<T, D, true>
                                : attention_forward_mma_kernel<T, D, false>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kSmemBytes<D>)));
  const int64_t q_tiles = (s.t + kQRows<D> - 1) / kQRows<D>;
  const int64_t blocks = s.b * s.hq * q_tiles;
  LOOM_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "attention_forward: ", blocks,
             " blocks exceed the grid limit");
  kernel<<<static_cast<unsigned>(blocks), kMmaThreads, kSmemBytes<D>, compute_stream()>>>(
      static_cast<const uint16_t*>(q.raw_data()), static_cast<const uint16_t*>(k.raw_data()),
      static_cast<const uint16_t*>(v.raw_data()), doc_start, static_cast<uint16_t*>(out.raw_data()),
      lse.data<float>(), s, scale * kLog2e, q_tiles);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <typename T>
void forward_mma_typed(const Tensor& q, const Tensor& k, const Tensor& v, const int32_t* doc_start,
                       const AttnShape& s, float scale, Tensor& out, Tensor& lse) {
  if (s.d == 64) {
    launch_forward_mma<T, 64>(q, k, v, doc_start, s, scale, out, lse);
  } else {
    launch_forward_mma<T, 128>(q, k, v, doc_start, s, scale, out, lse);
  }
}

}  // namespace

bool attention_forward_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const AttnShape& s) {
  return (q.dtype() == DType::kBF16 || q.dtype() == DType::kF16) && (s.d == 64 || s.d == 128) &&
         aligned16(q) && aligned16(k) && aligned16(v) && aligned16(out);
}

void attention_forward_mma(const Tensor& q, const Tensor& k, const Tensor& v,
                           const int32_t* doc_start, const AttnShape& s, float scale, Tensor& out,
                           Tensor& lse) {
  LOOM_CHECK(attention_forward_mma_supported(q, k, v, out, s),
             "attention_forward: the tensor-core path does not take this call");
  if (q.dtype() == DType::kBF16) {
    forward_mma_typed<BFloat16>(q, k, v, doc_start, s, scale, out, lse);
  } else {
    forward_mma_typed<Float16>(q, k, v, doc_start, s, scale, out, lse);
  }
}

}  // namespace loom::kernels::cuda
