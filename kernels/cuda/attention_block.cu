// kernels/cuda/attention_block.cu — CUDA block attention for ring attention (Note [Attention
// block kernel contract] in kernels/attention_block.h): one block of queries against one block
// of keys/values at arbitrary global offsets, causal by global position; the online-softmax
// merge of partial results; and the backward share of one block pair, accumulated into dq, dk,
// dv. f32, bf16 and f16 storage, f32 math, lse and delta in f32. These are also the general
// path of causal self-attention (kernels/cuda/attention.cu calls them with Tq = Tk, shift 0:
// block_attention_forward/backward in attention.cuh); the tiles and device helpers are
// attention_tile.cuh's. No Tq×Tk buffer exists. For causal self-attention they also take packed
// documents' doc_start (Note [Packed documents] in kernels/attention.h; null for ring blocks):
// key tiles before the first row's document are never loaded, tiles a row does not see are
// skipped, and only the tiles a document boundary crosses are masked per element.
// Every output element has one writer and a fixed summation order (no atomics), so results
// are bitwise reproducible. Work runs on the compute stream; nothing synchronises the host.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention_block.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kFwdRowsPerWarp = 4;  // forward: query rows per warp
constexpr int kBwdRowsPerWarp = 2;  // backward: key rows (dk, dv) or query rows (dq)
constexpr int kFwdRows = kWarps * kFwdRowsPerWarp;  // query rows per forward block
constexpr int kBwdRows = kWarps * kBwdRowsPerWarp;  // rows per backward block
static_assert(attention_smem_bytes(2 * kKeyTile, kFwdRows, kMaxD) <= kDefaultDynamicSmem &&
                  attention_smem_bytes(2 * kKeyTile, 2 * kBwdRows, kMaxD) <= kDefaultDynamicSmem,
              "the general kernels' shared memory must fit 48 KiB at d = kMaxD (no opt-in)");

// Keys visible to query row i: rows [0, n) of the key block.
__device__ __forceinline__ int64_t visible_keys(int64_t i, const BlockShape& s) {
  const int64_t n = i + s.shift + 1;
  return n < 0 ? 0 : (n > s.tk ? s.tk : n);
}

// The first key query row i (< Tq) sees: its document's start with packed documents (self
// blocks only: Tq = Tk, shift 0), else 0.
__device__ __forceinline__ int64_t first_key(const int32_t* doc_start, int64_t i) {
  return doc_start ? doc_start[i] : 0;
}

// The first key tile (a multiple of kKeyTile) any of the rows from q0 on sees: doc_start is
// non-decreasing, so row q0 has the smallest.
__device__ __forceinline__ int64_t first_key_tile(const int32_t* doc_start, int64_t q0) {
  return first_key(doc_start, q0) / kKeyTile * kKeyTile;
}

// Forward: one block per (b, h, tile of kFwdRows query rows), heaviest (last) tiles first; warp w
// owns rows w·kFwdRowsPerWarp… of the tile. Per key tile of 32 keys staged in shared memory,
// lane j scores key j against the warp's row, the warp updates the row's online softmax (max
// m, sum l) and every lane its columns of the output. A row that sees no key gets out 0 and
// lse −inf. With doc_start, row i sees keys [doc_start[i], n): the walk starts at the tile's
// first row's first key, and a row skips the key tiles wholly before its document.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    block_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         const int32_t* __restrict__ doc_start, T* __restrict__ out,
                         float* __restrict__ lse, BlockShape s, float scale, int64_t q_tiles) {
  extern __shared__ float block_smem[];
  const int d = static_cast<int>(s.d), dp = d + 1;  // +1: lane-strided rows hit distinct banks
  float* qs = block_smem;                           // (kFwdRows, d)
  float* ks = qs + kFwdRows * d;                    // (kKeyTile, d + 1)
  float* vs = ks + kKeyTile * dp;                   // (kKeyTile, d + 1)
  const int64_t tile = q_tiles - 1 - static_cast<int64_t>(blockIdx.x) % q_tiles;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) / q_tiles;  // b·Hq + h
  const int64_t kv = (bh / s.hq) * s.hkv + (bh % s.hq) / s.group;
  const int64_t q0 = tile * kFwdRows, q_end = min64(q0 + kFwdRows, s.tq);
  const int64_t k_end = visible_keys(q_end - 1, s);  // keys the tile's last row sees
  const T* kb = k + kv * s.tk * d;
  const T* vb = v + kv * s.tk * d;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  load_rows(qs, d, q + bh * s.tq * d, q0, kFwdRows, s.tq, d);

  float o[kFwdRowsPerWarp][kChunks] = {};
  float m[kFwdRowsPerWarp], l[kFwdRowsPerWarp];
  int64_t lo[kFwdRowsPerWarp], n[kFwdRowsPerWarp];  // row rr sees keys [lo, n) (none past Tq)
#pragma unroll
  for (int rr = 0; rr < kFwdRowsPerWarp; ++rr) {
    const int64_t i = q0 + warp * kFwdRowsPerWarp + rr;
    m[rr] = -INFINITY;
    l[rr] = 0.f;
    n[rr] = i < s.tq ? visible_keys(i, s) : 0;
    lo[rr] = i < s.tq ? first_key(doc_start, i) : 0;
  }
  for (int64_t k0 = first_key_tile(doc_start, q0); k0 < k_end; k0 += kKeyTile) {
    __syncthreads();  // the previous key tile is consumed (and qs is written)
    load_rows(ks, dp, kb, k0, kKeyTile, s.tk, d);
    load_rows(vs, dp, vb, k0, kKeyTile, s.tk, d);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kFwdRowsPerWarp; ++rr) {
      if (k0 >= n[rr] || k0 + kKeyTile <= lo[rr]) continue;  // warp-uniform: no key seen
      const int r = warp * kFwdRowsPerWarp + rr;
      const bool seen = k0 + lane >= lo[rr] && k0 + lane < n[rr];
      const float sc = seen ? scale * dot_smem(qs + r * d, ks + lane * dp, d) : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(sc));  // finite: a key of the tile is visible
      const float alpha = expf(m[rr] - m_new);
      const float p = seen ? expf(sc - m_new) : 0.f;
      l[rr] = l[rr] * alpha + warp_sum(p);
      m[rr] = m_new;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) o[rr][c] *= alpha;
      const int jn = static_cast<int>(min64(kKeyTile, n[rr] - k0));    // visible keys of the tile:
      const int j0 = lo[rr] > k0 ? static_cast<int>(lo[rr] - k0) : 0;  // [j0, jn)
      for (int jj = j0; jj < jn; ++jj) {
        const float pj = __shfl_sync(kFullMask, p, jj);
        const float* vr = vs + jj * dp;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int col = lane + kWarpSize * c;
          if (col < d) o[rr][c] = fmaf(pj, vr[col], o[rr][c]);
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kFwdRowsPerWarp; ++rr) {
    const int64_t i = q0 + warp * kFwdRowsPerWarp + rr;
    if (i >= s.tq) continue;
    const float inv = n[rr] > 0 ? 1.f / l[rr] : 0.f;  // o is 0 where no key is visible
    T* orow = out + (bh * s.tq + i) * d;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int col = lane + kWarpSize * c;
      if (col < d) orow[col] = convert<T>(o[rr][c] * inv);
    }
    if (lane == 0) lse[bh * s.tq + i] = n[rr] > 0 ? m[rr] + logf(l[rr]) : -INFINITY;
  }
}

// Merge: a warp per row (grid-stride); rows whose block_lse is −inf stay as they are. The
// lanes read the row's lse before lane 0 overwrites it (__syncwarp between).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    block_merge_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ bout,
                       const float* __restrict__ blse, int64_t rows, int d) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarpSize; r < rows;
       r += step) {
    const float b = blse[r];
    if (isinf(b) && b < 0.f) continue;  // warp-uniform: the block saw no key for this row
    const float a = lse[r];
    const float mx = fmaxf(a, b);
    const float total = mx + logf(expf(a - mx) + expf(b - mx));
    const float wa = expf(a - total), wb = expf(b - total);
    T* o = out + r * d;
    const T* bo = bout + r * d;
    for (int c = lane; c < d; c += kWarpSize) {
      o[c] = convert<T>(wa * convert<float>(o[c]) + wb * convert<float>(bo[c]));
    }
    __syncwarp();
    if (lane == 0) lse[r] = total;
  }
}

// dk, dv: one block per (b, kv head, tile of kBwdRows keys), first (most seen) tiles first;
// warp w owns keys w·kBwdRowsPerWarp… . The block walks every query head of the group and
// every query tile (32 rows, one per lane) from the first query that sees its first key, in a
// fixed order, so dk and dv sum the group's heads deterministically with one writer each. With
// doc_start the walk ends at the first query tile whose rows all start after the block's last
// key (the end of that key's document), and a key meets only the rows of its document.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    block_backward_dkv_kernel(const T* __restrict__ q, const T* __restrict__ k,
                              const T* __restrict__ v, const T* __restrict__ dout,
                              const float* __restrict__ lse, const float* __restrict__ delta,
                              const int32_t* __restrict__ doc_start, T* __restrict__ dk,
                              T* __restrict__ dv, BlockShape s, float scale, int64_t k_tiles) {
  extern __shared__ float block_smem[];
  const int d = static_cast<int>(s.d), dp = d + 1;
  float* qs = block_smem;           // (kKeyTile, d + 1) query rows of the tile
  float* dos = qs + kKeyTile * dp;  // (kKeyTile, d + 1) their dout rows
  float* ks = dos + kKeyTile * dp;  // (kBwdRows, d)
  float* vs = ks + kBwdRows * d;    // (kBwdRows, d)
  const int64_t tile = static_cast<int64_t>(blockIdx.x) % k_tiles;
  const int64_t bkv = static_cast<int64_t>(blockIdx.x) / k_tiles;  // b·Hkv + kv head
  const int64_t b = bkv / s.hkv, kvh = bkv % s.hkv;
  const int64_t k0 = tile * kBwdRows;
  const int64_t i_first = k0 - s.shift > 0 ? k0 - s.shift : 0;  // first query seeing key k0
  const int64_t k_last = min64(k0 + kBwdRows, s.tk) - 1;        // the block's last key
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  load_rows(ks, d, k + bkv * s.tk * d, k0, kBwdRows, s.tk, d);
  load_rows(vs, d, v + bkv * s.tk * d, k0, kBwdRows, s.tk, d);

  float adk[kBwdRowsPerWarp][kChunks] = {}, adv[kBwdRowsPerWarp][kChunks] = {};
  for (int64_t hh = 0; hh < s.group; ++hh) {
    const int64_t bh = b * s.hq + kvh * s.group + hh;
    for (int64_t i0 = i_first; i0 < s.tq; i0 += kKeyTile) {
      if (first_key(doc_start, i0) > k_last) break;  // block-uniform: later rows see none
      __syncthreads();  // the previous query tile is consumed (and ks, vs are written)
      load_rows(qs, dp, q + bh * s.tq * d, i0, kKeyTile, s.tq, d);
      load_rows(dos, dp, dout + bh * s.tq * d, i0, kKeyTile, s.tq, d);
      __syncthreads();
      const int64_t i = i0 + lane;
      const float lse_i = i < s.tq ? lse[bh * s.tq + i] : 0.f;
      const float delta_i = i < s.tq ? delta[bh * s.tq + i] : 0.f;
      const int64_t lo_i = i < s.tq ? first_key(doc_start, i) : 0;  // row i's first key
      const int ii_end = static_cast<int>(min64(kKeyTile, s.tq - i0));
#pragma unroll
      for (int rr = 0; rr < kBwdRowsPerWarp; ++rr) {
        const int r = warp * kBwdRowsPerWarp + rr;
        const int64_t j = k0 + r;
        const int64_t i_min = j - s.shift;                // the first query that sees key j
        if (j >= s.tk || i_min >= i0 + ii_end) continue;  // warp-uniform
        // The rows that see key j: i_min ≤ i < Tq and, with doc_start, lo_i ≤ j (a prefix of
        // the rows, doc_start being non-decreasing), so the lanes [ii0, ii1) of `seen`.
        const bool sees = i >= i_min && i < s.tq && lo_i <= j;
        const unsigned seen = __ballot_sync(kFullMask, sees);
        if (seen == 0u) continue;  // warp-uniform: no row of the tile is in j's document
        float p = 0.f, ds = 0.f;
        if (sees) {
          p = expf(scale * dot_smem(qs + lane * dp, ks + r * d, d) - lse_i);
          ds = p * (dot_smem(dos + lane * dp, vs + r * d, d) - delta_i);
        }
        const int ii0 = __ffs(seen) - 1, ii1 = kWarpSize - __clz(seen);
        for (int ii = ii0; ii < ii1; ++ii) {
          const float pi = __shfl_sync(kFullMask, p, ii);
          const float dsi = __shfl_sync(kFullMask, ds, ii);
          const float* dor = dos + ii * dp;
          const float* qr = qs + ii * dp;
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const int col = lane + kWarpSize * c;
            if (col < d) {
              adv[rr][c] = fmaf(pi, dor[col], adv[rr][c]);
              adk[rr][c] = fmaf(dsi, qr[col], adk[rr][c]);
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kBwdRowsPerWarp; ++rr) {
    const int64_t j = k0 + warp * kBwdRowsPerWarp + rr;
    if (j >= s.tk) continue;
    accumulate_row(dk + (bkv * s.tk + j) * d, adk[rr], scale, d, lane);
    accumulate_row(dv + (bkv * s.tk + j) * d, adv[rr], 1.f, d, lane);
  }
}

// dq: one block per (b, h, tile of kBwdRows query rows), heaviest (last) tiles first; warp w
// owns rows w·kBwdRowsPerWarp… and walks the key tiles (32 keys, one per lane) its rows see
// (with doc_start, from the tile's first row's document start, as the forward).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    block_backward_dq_kernel(const T* __restrict__ q, const T* __restrict__ k,
                             const T* __restrict__ v, const T* __restrict__ dout,
                             const float* __restrict__ lse, const float* __restrict__ delta,
                             const int32_t* __restrict__ doc_start, T* __restrict__ dq,
                             BlockShape s, float scale, int64_t q_tiles) {
  extern __shared__ float block_smem[];
  const int d = static_cast<int>(s.d), dp = d + 1;
  float* ks = block_smem;          // (kKeyTile, d + 1)
  float* vs = ks + kKeyTile * dp;  // (kKeyTile, d + 1)
  float* qs = vs + kKeyTile * dp;  // (kBwdRows, d)
  float* dos = qs + kBwdRows * d;  // (kBwdRows, d)
  const int64_t tile = q_tiles - 1 - static_cast<int64_t>(blockIdx.x) % q_tiles;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) / q_tiles;
  const int64_t kv = (bh / s.hq) * s.hkv + (bh % s.hq) / s.group;
  const int64_t q0 = tile * kBwdRows, q_end = min64(q0 + kBwdRows, s.tq);
  const int64_t k_end = visible_keys(q_end - 1, s);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  load_rows(qs, d, q + bh * s.tq * d, q0, kBwdRows, s.tq, d);
  load_rows(dos, d, dout + bh * s.tq * d, q0, kBwdRows, s.tq, d);
  float lse_r[kBwdRowsPerWarp], delta_r[kBwdRowsPerWarp];
  int64_t lo[kBwdRowsPerWarp], n[kBwdRowsPerWarp];  // row rr sees keys [lo, n) (none past Tq)
#pragma unroll
  for (int rr = 0; rr < kBwdRowsPerWarp; ++rr) {
    const int64_t i = q0 + warp * kBwdRowsPerWarp + rr;
    n[rr] = i < s.tq ? visible_keys(i, s) : 0;
    lo[rr] = i < s.tq ? first_key(doc_start, i) : 0;
    lse_r[rr] = n[rr] > 0 ? lse[bh * s.tq + i] : 0.f;
    delta_r[rr] = n[rr] > 0 ? delta[bh * s.tq + i] : 0.f;
  }
  float adq[kBwdRowsPerWarp][kChunks] = {};
  for (int64_t k0 = first_key_tile(doc_start, q0); k0 < k_end; k0 += kKeyTile) {
    __syncthreads();  // the previous key tile is consumed (and qs, dos are written)
    load_rows(ks, dp, k + kv * s.tk * d, k0, kKeyTile, s.tk, d);
    load_rows(vs, dp, v + kv * s.tk * d, k0, kKeyTile, s.tk, d);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kBwdRowsPerWarp; ++rr) {
      if (k0 >= n[rr] || k0 + kKeyTile <= lo[rr]) continue;  // warp-uniform: no key seen
      const int r = warp * kBwdRowsPerWarp + rr;
      float ds = 0.f;
      if (k0 + lane >= lo[rr] && k0 + lane < n[rr]) {
        const float p = expf(scale * dot_smem(qs + r * d, ks + lane * dp, d) - lse_r[rr]);
        ds = p * (dot_smem(dos + r * d, vs + lane * dp, d) - delta_r[rr]);
      }
      const int jn = static_cast<int>(min64(kKeyTile, n[rr] - k0));
      const int j0 = lo[rr] > k0 ? static_cast<int>(lo[rr] - k0) : 0;
      for (int jj = j0; jj < jn; ++jj) {
        const float dsj = __shfl_sync(kFullMask, ds, jj);
        const float* kr = ks + jj * dp;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int col = lane + kWarpSize * c;
          if (col < d) adq[rr][c] = fmaf(dsj, kr[col], adq[rr][c]);
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kBwdRowsPerWarp; ++rr) {
    const int64_t i = q0 + warp * kBwdRowsPerWarp + rr;
    if (i < s.tq) accumulate_row(dq + (bh * s.tq + i) * d, adq[rr], scale, d, lane);
  }
}

// ---- launchers ---------------------------------------------------------------------------

void check_dtype(DType dt, const char* name) {
  LOOM_CHECK(dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16, name, ": dtype ",
             dtype_name(dt), " not supported on cuda (f32, bf16, f16)");
}

BlockShape block_shape(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset,
                       int64_t k_offset, const char* name) {
  LOOM_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape(), name,
             ": q must be (B, Hq, Tq, D) and k, v (B, Hkv, Tk, D), got ", shape_str(q.shape()),
             ", ", shape_str(k.shape()), ", ", shape_str(v.shape()));
  BlockShape s{q.size(0), q.size(1), k.size(1), q.size(2),
               k.size(2), q.size(3), 1,         q_offset - k_offset};
  LOOM_CHECK(k.size(0) == s.b && k.size(3) == s.d && s.hkv > 0 && s.hq % s.hkv == 0, name, ": q ",
             shape_str(q.shape()), " and k ", shape_str(k.shape()), " do not match");
  s.group = s.hq / s.hkv;
  LOOM_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), name,
             ": tensors must be contiguous");
  LOOM_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), name, ": dtypes differ");
  check_dtype(q.dtype(), name);
  LOOM_CHECK(s.d <= kMaxD, name, ": head size ", s.d, " above ", kMaxD, " not supported on cuda");
  return s;
}

template <typename T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const int32_t* doc_start,
                   const BlockShape& s, float scale, Tensor& out, Tensor& lse) {
  const int64_t q_tiles = (s.tq + kFwdRows - 1) / kFwdRows;
  const unsigned grid = attention_grid(s.b * s.hq, q_tiles, "attention_block_forward");
  const size_t smem = attention_smem_bytes(2 * kKeyTile, kFwdRows, s.d);
  block_forward_kernel<T><<<grid, kThreads, smem, compute_stream()>>>(
      q.data<T>(), k.data<T>(), v.data<T>(), doc_start, out.data<T>(), lse.data<float>(), s, scale,
      q_tiles);
  LOOM_CUDA_LAUNCH_CHECK();
}

void attention_block_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                  int64_t q_offset, int64_t k_offset, double scale, Tensor& out,
                                  Tensor& lse) {
  const char* name = "attention_block_forward";
  const BlockShape s = block_shape(q, k, v, q_offset, k_offset, name);
  check_like(out, q.shape(), q.dtype(), name, "out");
  check_like(lse, {s.b, s.hq, s.tq}, DType::kF32, name, "lse");
  LOOM_CHECK(scale > 0, name, ": scale must be positive, got ", scale);
  if (q.numel() == 0) return;  // a key block of length 0 still writes out 0 and lse −inf
  CudaDeviceGuard guard(q.device().index);
  block_attention_forward(q, k, v, nullptr, s, static_cast<float>(scale), out, lse);
}

template <typename T>
void merge_typed(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse) {
  const int64_t rows = lse.numel();
  block_merge_kernel<T><<<grid_for(rows * kWarpSize, kThreads), kThreads, 0, compute_stream()>>>(
      out.data<T>(), lse.data<float>(), block_out.data<T>(), block_lse.data<float>(), rows,
      static_cast<int>(out.size(3)));
  LOOM_CUDA_LAUNCH_CHECK();
}

void attention_block_merge_cuda(Tensor& out, Tensor& lse, const Tensor& block_out,
                                const Tensor& block_lse) {
  const char* name = "attention_block_merge";
  LOOM_CHECK(out.dim() == 4 && out.is_contiguous(), name,
             ": out must be contiguous (B, H, T, D), got ", shape_str(out.shape()));
  check_dtype(out.dtype(), name);
  const Shape rows_shape{out.size(0), out.size(1), out.size(2)};
  check_like(lse, rows_shape, DType::kF32, name, "lse");
  check_like(block_out, out.shape(), out.dtype(), name, "block_out");
  check_like(block_lse, rows_shape, DType::kF32, name, "block_lse");
  if (lse.numel() == 0) return;
  CudaDeviceGuard guard(out.device().index);
  switch (out.dtype()) {
    case DType::kBF16:
      return merge_typed<BFloat16>(out, lse, block_out, block_lse);
    case DType::kF16:
      return merge_typed<Float16>(out, lse, block_out, block_lse);
    default:
      return merge_typed<float>(out, lse, block_out, block_lse);
  }
}

struct BlockGrads {
  const Tensor &q, &k, &v, &lse, &delta, &dout;
  Tensor &dq, &dk, &dv;
  const int32_t* doc_start;  // null: one document (always for ring blocks)
};

template <typename T>
void backward_typed(const BlockGrads& g, const BlockShape& s, float scale) {
  const size_t smem = attention_smem_bytes(2 * kKeyTile, 2 * kBwdRows, s.d);
  const int64_t k_tiles = (s.tk + kBwdRows - 1) / kBwdRows;
  const unsigned dkv_grid = attention_grid(s.b * s.hkv, k_tiles, "attention_block_backward");
  block_backward_dkv_kernel<T><<<dkv_grid, kThreads, smem, compute_stream()>>>(
      g.q.data<T>(), g.k.data<T>(), g.v.data<T>(), g.dout.data<T>(), g.lse.data<float>(),
      g.delta.data<float>(), g.doc_start, g.dk.data<T>(), g.dv.data<T>(), s, scale, k_tiles);
  LOOM_CUDA_LAUNCH_CHECK();
  const int64_t q_tiles = (s.tq + kBwdRows - 1) / kBwdRows;
  const unsigned dq_grid = attention_grid(s.b * s.hq, q_tiles, "attention_block_backward");
  block_backward_dq_kernel<T><<<dq_grid, kThreads, smem, compute_stream()>>>(
      g.q.data<T>(), g.k.data<T>(), g.v.data<T>(), g.dout.data<T>(), g.lse.data<float>(),
      g.delta.data<float>(), g.doc_start, g.dq.data<T>(), s, scale, q_tiles);
  LOOM_CUDA_LAUNCH_CHECK();
}

void attention_block_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& lse, const Tensor& delta, const Tensor& dout,
                                   int64_t q_offset, int64_t k_offset, double scale, Tensor& dq,
                                   Tensor& dk, Tensor& dv) {
  const char* name = "attention_block_backward";
  const BlockShape s = block_shape(q, k, v, q_offset, k_offset, name);
  check_like(lse, {s.b, s.hq, s.tq}, DType::kF32, name, "lse");
  check_like(delta, {s.b, s.hq, s.tq}, DType::kF32, name, "delta");
  check_like(dout, q.shape(), q.dtype(), name, "dout");
  check_like(dq, q.shape(), q.dtype(), name, "dq");
  check_like(dk, k.shape(), q.dtype(), name, "dk");
  check_like(dv, v.shape(), q.dtype(), name, "dv");
  LOOM_CHECK(scale > 0, name, ": scale must be positive, got ", scale);
  // Nothing to add when the block is empty or no query sees any key (q's last row, at
  // q_offset + Tq − 1, precedes the first key).
  if (q.numel() == 0 || k.numel() == 0 || s.tq - 1 + s.shift < 0) return;
  CudaDeviceGuard guard(q.device().index);
  block_attention_backward(q, k, v, lse, delta, dout, nullptr, s, static_cast<float>(scale), dq, dk,
                           dv);
}

}  // namespace

void block_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                             const int32_t* doc_start, const BlockShape& s, float scale,
                             Tensor& out, Tensor& lse) {
  LOOM_CHECK(!doc_start || (s.shift == 0 && s.tq == s.tk),
             "block_attention_forward: doc_start needs a self block (Tq = Tk, shift 0)");
  switch (q.dtype()) {
    case DType::kBF16:
      return forward_typed<BFloat16>(q, k, v, doc_start, s, scale, out, lse);
    case DType::kF16:
      return forward_typed<Float16>(q, k, v, doc_start, s, scale, out, lse);
    default:
      return forward_typed<float>(q, k, v, doc_start, s, scale, out, lse);
  }
}

void block_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                              const Tensor& delta, const Tensor& dout, const int32_t* doc_start,
                              const BlockShape& s, float scale, Tensor& dq, Tensor& dk,
                              Tensor& dv) {
  LOOM_CHECK(!doc_start || (s.shift == 0 && s.tq == s.tk),
             "block_attention_backward: doc_start needs a self block (Tq = Tk, shift 0)");
  const BlockGrads g{q, k, v, lse, delta, dout, dq, dk, dv, doc_start};
  switch (q.dtype()) {
    case DType::kBF16:
      return backward_typed<BFloat16>(g, s, scale);
    case DType::kF16:
      return backward_typed<Float16>(g, s, scale);
    default:
      return backward_typed<float>(g, s, scale);
  }
}

LOOM_REGISTER_KERNEL(attention_block_forward, kCuda, attention_block_forward_cuda);
LOOM_REGISTER_KERNEL(attention_block_merge, kCuda, attention_block_merge_cuda);
LOOM_REGISTER_KERNEL(attention_block_backward, kCuda, attention_block_backward_cuda);

}  // namespace loom::kernels::cuda
