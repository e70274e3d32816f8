// kernels/cuda/attention_mma_backward.cu — the tensor-core causal attention backward for bf16
// and f16 with D = 64 (Note [Attention kernel contract] in kernels/attention.h), FA2's
// deterministic split: one kernel per (b, kv head, 64-key tile) walks every query head of the
// group and every 64-row query tile at or after its keys and accumulates dk, dv in registers
// (Sᵀ = K Qᵀ, dPᵀ = V doutᵀ, dV += Pᵀ dout, dK += dSᵀ Q); a second per (b, h, 64-row query
// tile) walks the key tiles up to its rows for dq (S = Q Kᵀ, dP = dout Vᵀ, dQ += dS K). Tiles
// stream through double-buffered shared memory with cp.async; products are mma.sync m16n8k16
// with f32 accumulation; P and dS are rounded to the input format as mma operands (Note [mma
// fragments] in kernels/cuda/attention_mma.cuh). Each gradient element has one writer, which adds
// its f32 sum to the stored value once. With packed documents (Note [Packed documents] in
// kernels/attention.h; separate instantiations, kDocs, so the plain kernels keep their
// registers) the dk/dv block walks the query tiles only up to the end of its last
// key's document and the dq block starts at its first row's document, masking per element.
// Dᵢ = doutᵢ·outᵢ comes from the caller (attention.cu). This
// file registers nothing and must not synchronise the host. See docs/cuda_attention.md.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/dtype_convert.cuh"

namespace loom::kernels::cuda {
namespace {

using namespace mma;  // NOLINT(build/namespaces): the tensor-core building blocks

constexpr int kD = 64;  // the head size this backward handles
constexpr int kTile = kTileElems<kD>;
// dk/dv: K, V; Q and dout double-buffered; lse, D and doc_start of the query tile
// double-buffered.
constexpr size_t kDkvSmemBytes = 6 * kTile * sizeof(uint16_t) + 4 * kBlockRows * sizeof(float) +
                                 2 * kBlockRows * sizeof(int32_t);
// dq: Q, dout; K and V double-buffered.
constexpr size_t kDqSmemBytes = 6 * kTile * sizeof(uint16_t);
// 55 and 54 KiB: above the default 48 KiB (the launcher opts in), within every built
// architecture's per-block limit.
static_assert(kDkvSmemBytes <= kMaxOptinSmem && kDqSmemBytes <= kMaxOptinSmem,
              "the backward's shared memory must fit sm_80's per-block limit");

// dst[0], dst[1] (16-bit values of T's format, 4-byte aligned) += a, b; rounded once.
template <typename T>
__device__ __forceinline__ void accumulate_pair(uint16_t* dst, float a, float b) {
  const uint32_t old = *reinterpret_cast<const uint32_t*>(dst);
  T lo, hi;
  lo.bits = static_cast<uint16_t>(old & 0xffffu);
  hi.bits = static_cast<uint16_t>(old >> 16);
  *reinterpret_cast<uint32_t*>(dst) = pack2<T>(half_to_float(lo) + a, half_to_float(hi) + b);
}

// dk, dv: one block per (b, kv head, 64-key tile), lightest-last (key tile 0 sees every query
// tile). Warp w holds keys 16w + g and 16w + g + 8 of the tile (lane = 4g + t); the block
// walks the items (query head of the group, query tile) in a fixed order.
template <typename T, bool kDocs>
__global__ void __launch_bounds__(kMmaThreads)
    attention_backward_dkv_mma_kernel(const uint16_t* __restrict__ q,
                                      const uint16_t* __restrict__ k,
                                      const uint16_t* __restrict__ v,
                                      const uint16_t* __restrict__ dout,
                                      const float* __restrict__ lse, const float* __restrict__ dvec,
                                      const int32_t* __restrict__ doc_start,
                                      uint16_t* __restrict__ dk, uint16_t* __restrict__ dv,
                                      AttnShape s, float scale, int64_t k_tiles) {
  extern __shared__ __align__(16) unsigned char mma_smem[];
  uint16_t* ks = reinterpret_cast<uint16_t*>(mma_smem);                 // (64, kStride)
  uint16_t* vs = ks + kTile;                                            // (64, kStride)
  uint16_t* qs = vs + kTile;                                            // 2 × (64, kStride)
  uint16_t* dos = qs + 2 * kTile;                                       // 2 × (64, kStride)
  float* lse_s = reinterpret_cast<float*>(dos + 2 * kTile);             // 2 × 64
  float* dvec_s = lse_s + 2 * kBlockRows;                               // 2 × 64
  int32_t* lo_s = reinterpret_cast<int32_t*>(dvec_s + 2 * kBlockRows);  // 2 × 64 first keys

  const int64_t kt = static_cast<int64_t>(blockIdx.x) % k_tiles;
  const int64_t bkv = static_cast<int64_t>(blockIdx.x) / k_tiles;  // b·Hkv + kv head
  const int64_t b = bkv / s.hkv, kvh = bkv % s.hkv;
  const int64_t t = s.t, k0 = kt * kBlockRows;
  // Query tiles kt … qt_end − 1 see these keys: all of them, or with doc_start those up to the
  // one holding the end of the last key's document (a tile whose first row starts after the
  // last key sees none of them, nor does any later one).
  int64_t qt_end = k_tiles;
  if (kDocs) {
    const int64_t k_last = min64(k0 + kBlockRows, t) - 1;
    qt_end = kt + 1;
    while (qt_end < k_tiles && doc_start[qt_end * kBlockRows] <= k_last) ++qt_end;
  }
  const int64_t n_qt = qt_end - kt;
  const int64_t n_items = s.group * n_qt;
  load_tile_async<kD>(ks, k + (bkv * t + k0) * kD, min64(kBlockRows, t - k0));
  load_tile_async<kD>(vs, v + (bkv * t + k0) * kD, min64(kBlockRows, t - k0));

  // Starts the copies of item `item` into buffer `buf`; lse and D are plain stores, visible
  // after the barrier that precedes their use.
  const auto issue = [&](int64_t item, int buf) {
    const int64_t bh = b * s.hq + kvh * s.group + item / n_qt;
    const int64_t q0 = (kt + item % n_qt) * kBlockRows;
    load_tile_async<kD>(qs + buf * kTile, q + (bh * t + q0) * kD, min64(kBlockRows, t - q0));
    load_tile_async<kD>(dos + buf * kTile, dout + (bh * t + q0) * kD, min64(kBlockRows, t - q0));
    for (int r = static_cast<int>(threadIdx.x); r < kBlockRows; r += kMmaThreads) {
      const int64_t i = q0 + r;
      lse_s[buf * kBlockRows + r] = i < t ? lse[bh * t + i] : 0.f;
      dvec_s[buf * kBlockRows + r] = i < t ? dvec[bh * t + i] : 0.f;
      if (kDocs) lo_s[buf * kBlockRows + r] = i < t ? doc_start[i] : 0;
    }
  };
  issue(0, 0);
  cp_async_commit();

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, tq = lane & 3;
  const int64_t keys[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  const float scale_log2 = scale * kLog2e;
  uint32_t kf[kD / 16][4], vf[kD / 16][4];
  float dk_acc[kD / 8][4] = {}, dv_acc[kD / 8][4] = {};

  for (int64_t it = 0; it < n_items; ++it) {
    const int buf = static_cast<int>(it & 1);
    if (it + 1 < n_items) {  // prefetch the next item into the other buffer
      issue(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this item (and, at it = 0, K and V) is in shared memory
    if (it == 0) {
      load_a_fragments<kD>(kf, ks, warp, lane);
      load_a_fragments<kD>(vf, vs, warp, lane);
    }
    const int64_t q0 = (kt + it % n_qt) * kBlockRows;
    const uint16_t* q_tile = qs + buf * kTile;
    const uint16_t* do_tile = dos + buf * kTile;
    const float* lse_t = lse_s + buf * kBlockRows;
    const float* dvec_t = dvec_s + buf * kBlockRows;
    const int32_t* lo_t = lo_s + buf * kBlockRows;

    float st[kNTiles][4], dpt[kNTiles][4];  // Sᵀ and dPᵀ: the warp's 16 keys × 64 queries
    mma_abt<T, kD>(st, kf, q_tile, lane);
    mma_abt<T, kD>(dpt, vf, do_tile, lane);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * tq + (e & 1);
        const int64_t i = q0 + col, j = keys[e >> 1];
        float p = 0.f;
        if (i >= j && i < t && j < t && (!kDocs || lo_t[col] <= j)) {
          p = exp2f(st[nt][e] * scale_log2 - lse_t[col] * kLog2e);
        }
        st[nt][e] = p;                                // Pᵀ
        dpt[nt][e] = p * (dpt[nt][e] - dvec_t[col]);  // dSᵀ
      }
    }
    mma_pb<T, kD>(dv_acc, st, do_tile, lane);
    mma_pb<T, kD>(dk_acc, dpt, q_tile, lane);
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (keys[r] >= t) continue;
    uint16_t* dk_row = dk + (bkv * t + keys[r]) * kD;
    uint16_t* dv_row = dv + (bkv * t + keys[r]) * kD;
#pragma unroll
    for (int dn = 0; dn < kD / 8; ++dn) {
      const int col = dn * 8 + 2 * tq;
      accumulate_pair<T>(dk_row + col, scale * dk_acc[dn][2 * r], scale * dk_acc[dn][2 * r + 1]);
      accumulate_pair<T>(dv_row + col, dv_acc[dn][2 * r], dv_acc[dn][2 * r + 1]);
    }
  }
}

// dq: one block per (b, h, 64-row query tile), heaviest (last) tiles first. Warp w holds query
// rows 16w + g and 16w + g + 8 of the tile.
template <typename T, bool kDocs>
__global__ void __launch_bounds__(kMmaThreads)
    attention_backward_dq_mma_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                                     const uint16_t* __restrict__ v,
                                     const uint16_t* __restrict__ dout,
                                     const float* __restrict__ lse, const float* __restrict__ dvec,
                                     const int32_t* __restrict__ doc_start,
                                     uint16_t* __restrict__ dq, AttnShape s, float scale,
                                     int64_t q_tiles) {
  extern __shared__ __align__(16) unsigned char mma_smem[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(mma_smem);  // (64, kStride)
  uint16_t* dos = qs + kTile;                            // (64, kStride)
  uint16_t* ks = dos + kTile;                            // 2 × (64, kStride)
  uint16_t* vs = ks + 2 * kTile;                         // 2 × (64, kStride)

  const int64_t tile = q_tiles - 1 - static_cast<int64_t>(blockIdx.x) % q_tiles;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) / q_tiles;  // b·Hq + h
  const int64_t kv = (bh / s.hq) * s.hkv + (bh % s.hq) / s.group;
  const int64_t t = s.t;
  const int64_t q0 = tile * kBlockRows, q_end = min64(q0 + kBlockRows, t);
  const int64_t n_key_tiles = (q_end + kBlockRows - 1) / kBlockRows;
  // The first key tile any row sees: doc_start is non-decreasing, row q0 has the smallest.
  const int64_t kt_begin = kDocs ? doc_start[q0] / kBlockRows : 0;
  const uint16_t* kb = k + kv * t * kD;
  const uint16_t* vb = v + kv * t * kD;
  load_tile_async<kD>(qs, q + (bh * t + q0) * kD, q_end - q0);
  load_tile_async<kD>(dos, dout + (bh * t + q0) * kD, q_end - q0);
  const int64_t first = kt_begin * kBlockRows;
  load_tile_async<kD>(ks, kb + first * kD, min64(kBlockRows, t - first));
  load_tile_async<kD>(vs, vb + first * kD, min64(kBlockRows, t - first));
  cp_async_commit();

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, tq = lane & 3;
  const int64_t rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float lse_log2[2], dvec_r[2];
  int32_t lo[2];  // kDocs: the row's first key (its document's start)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse_log2[r] = rows[r] < t ? lse[bh * t + rows[r]] * kLog2e : 0.f;
    dvec_r[r] = rows[r] < t ? dvec[bh * t + rows[r]] : 0.f;
    lo[r] = kDocs && rows[r] < t ? doc_start[rows[r]] : 0;
  }
  // The smallest first key of the warp's rows: key tiles ending at or before it are not seen.
  const int64_t warp_row0 = q0 + warp * 16;
  const int32_t warp_lo_min = kDocs && warp_row0 < t ? doc_start[warp_row0] : 0;
  const float scale_log2 = scale * kLog2e;
  uint32_t qf[kD / 16][4], dof[kD / 16][4];
  float dq_acc[kD / 8][4] = {};

  for (int64_t kt = kt_begin; kt < n_key_tiles; ++kt) {
    const int buf = static_cast<int>((kt - kt_begin) & 1);
    if (kt + 1 < n_key_tiles) {  // prefetch the next key tile into the other buffer
      const int64_t next = (kt + 1) * kBlockRows;
      load_tile_async<kD>(ks + (buf ^ 1) * kTile, kb + next * kD, min64(kBlockRows, t - next));
      load_tile_async<kD>(vs + (buf ^ 1) * kTile, vb + next * kD, min64(kBlockRows, t - next));
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this tile (and, at kt_begin, Q and dout) is in shared memory
    if (kt == kt_begin) {
      load_a_fragments<kD>(qf, qs, warp, lane);
      load_a_fragments<kD>(dof, dos, warp, lane);
    }
    const uint16_t* k_tile = ks + buf * kTile;
    const int64_t k0 = kt * kBlockRows;
    // Warp-uniform: with documents, a tile ending before the warp's first row's is not seen.
    if (!kDocs || k0 + kBlockRows > warp_lo_min) {
      float sc[kNTiles][4], dp[kNTiles][4];  // S and dP: the warp's 16 rows × 64 keys
      mma_abt<T, kD>(sc, qf, k_tile, lane);
      mma_abt<T, kD>(dp, dof, vs + buf * kTile, lane);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t key = k0 + nt * 8 + 2 * tq + (e & 1), row = rows[e >> 1];
          float p = 0.f;
          if (key <= row && key < t && (!kDocs || key >= lo[e >> 1])) {
            p = exp2f(sc[nt][e] * scale_log2 - lse_log2[e >> 1]);
          }
          dp[nt][e] = p * (dp[nt][e] - dvec_r[e >> 1]);  // dS
        }
      }
      mma_pb<T, kD>(dq_acc, dp, k_tile, lane);
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= t) continue;
    uint16_t* dq_row = dq + (bh * t + rows[r]) * kD;
#pragma unroll
    for (int dn = 0; dn < kD / 8; ++dn) {
      accumulate_pair<T>(dq_row + dn * 8 + 2 * tq, scale * dq_acc[dn][2 * r],
                         scale * dq_acc[dn][2 * r + 1]);
    }
  }
}

const uint16_t* bits(const Tensor& x) { return static_cast<const uint16_t*>(x.raw_data()); }
uint16_t* bits_mut(Tensor& x) { return static_cast<uint16_t*>(x.raw_data()); }

unsigned grid_blocks(int64_t blocks) {
  LOOM_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "attention_backward: ", blocks,
             " blocks exceed the grid limit");
  return static_cast<unsigned>(blocks);
}

template <typename T>
void launch_backward_mma(const Tensor& q, const Tensor& k, const Tensor& v,
                         const int32_t* doc_start, const Tensor& dout, const Tensor& lse,
                         const Tensor& dvec, const AttnShape& s, float scale, Tensor& dq,
                         Tensor& dk, Tensor& dv) {
  const int64_t tiles = (s.t + kBlockRows - 1) / kBlockRows;
  const auto dkv_kernel = doc_start ? attention_backward_dkv_mma_kernel<T, true>
                                    : attention_backward_dkv_mma_kernel<T, false>;
  CUDA_CHECK(cudaFuncSetAttribute(dkv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kDkvSmemBytes)));
  dkv_kernel<<<grid_blocks(s.b * s.hkv * tiles), kMmaThreads, kDkvSmemBytes, compute_stream()>>>(
      bits(q), bits(k), bits(v), bits(dout), lse.data<float>(), dvec.data<float>(), doc_start,
      bits_mut(dk), bits_mut(dv), s, scale, tiles);
  LOOM_CUDA_LAUNCH_CHECK();
  const auto dq_kernel = doc_start ? attention_backward_dq_mma_kernel<T, true>
                                   : attention_backward_dq_mma_kernel<T, false>;
  CUDA_CHECK(cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kDqSmemBytes)));
  dq_kernel<<<grid_blocks(s.b * s.hq * tiles), kMmaThreads, kDqSmemBytes, compute_stream()>>>(
      bits(q), bits(k), bits(v), bits(dout), lse.data<float>(), dvec.data<float>(), doc_start,
      bits_mut(dq), s, scale, tiles);
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool attention_backward_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& dout, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv, const AttnShape& s) {
  return (q.dtype() == DType::kBF16 || q.dtype() == DType::kF16) && s.d == kD && aligned16(q) &&
         aligned16(k) && aligned16(v) && aligned16(dout) && aligned16(dq) && aligned16(dk) &&
         aligned16(dv);
}

void attention_backward_mma(const Tensor& q, const Tensor& k, const Tensor& v,
                            const int32_t* doc_start, const Tensor& dout, const Tensor& lse,
                            const Tensor& dvec, const AttnShape& s, float scale, Tensor& dq,
                            Tensor& dk, Tensor& dv) {
  LOOM_CHECK(attention_backward_mma_supported(q, k, v, dout, dq, dk, dv, s),
             "attention_backward: the tensor-core path does not take this call");
  if (q.dtype() == DType::kBF16) {
    launch_backward_mma<BFloat16>(q, k, v, doc_start, dout, lse, dvec, s, scale, dq, dk, dv);
  } else {
    launch_backward_mma<Float16>(q, k, v, doc_start, dout, lse, dvec, s, scale, dq, dk, dv);
  }
}

}  // namespace loom::kernels::cuda
