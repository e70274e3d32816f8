// kernels/cuda/attention.cu — CUDA causal attention (Note [Attention kernel contract] in
// kernels/attention.h): the registered launchers, and the general path for every case the
// tensor-core kernels (attention_mma*.cu) do not take: f32, and bf16/f16 with other head sizes
// (forward: D not 64 or 128; backward: D not 64); also the backward's Dᵢ pre-pass. The general
// path computes in f32 with FMAs on tiles staged in shared memory; no T×T buffer exists
// anywhere. Every output element has exactly one writer and a fixed summation order, so
// results do not depend on the launch order (no atomics). Work runs on the compute stream;
// nothing here synchronises the host. See docs/cuda_attention.md. The tile constants and device
// helpers live in attention_tile.cuh, shared with attention_block.cu (ring attention's blocks).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/attention.h"
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
static_assert(kKeyTile % kBwdRows == 0, "a dk/dv block's keys must sit inside one query tile");

// Forward: one block per (b, h, tile of kFwdRows query rows), heaviest (last) tiles first; warp w
// owns rows w·kFwdRowsPerWarp… of the tile. Per key tile of 32 keys staged in shared memory,
// lane j scores key j against the warp's row, the warp updates the row's online softmax
// (max m, sum l) and every lane its columns of the output.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const T* __restrict__ q, const T* __restrict__ k,
                             const T* __restrict__ v, T* __restrict__ out,
                             float* __restrict__ lse, AttnShape s, float scale, int64_t q_tiles) {
  extern __shared__ float attn_smem[];
  const int d = static_cast<int>(s.d), dp = d + 1;  // +1: lane-strided rows hit distinct banks
  float* qs = attn_smem;           // (kFwdRows, d)
  float* ks = qs + kFwdRows * d;   // (kKeyTile, d + 1)
  float* vs = ks + kKeyTile * dp;  // (kKeyTile, d + 1)
  const int64_t tile = q_tiles - 1 - static_cast<int64_t>(blockIdx.x) % q_tiles;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) / q_tiles;  // b·Hq + h
  const int64_t kv = (bh / s.hq) * s.hkv + (bh % s.hq) / s.group;
  const int64_t q0 = tile * kFwdRows, q_end = min64(q0 + kFwdRows, s.t);
  const T* kb = k + kv * s.t * d;
  const T* vb = v + kv * s.t * d;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  load_rows(qs, d, q + bh * s.t * d, q0, kFwdRows, s.t, d);

  float o[kFwdRowsPerWarp][kChunks] = {};
  float m[kFwdRowsPerWarp], l[kFwdRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kFwdRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.f;
  }
  for (int64_t k0 = 0; k0 < q_end; k0 += kKeyTile) {
    __syncthreads();  // the previous key tile is consumed (and qs is written)
    load_rows(ks, dp, kb, k0, kKeyTile, s.t, d);
    load_rows(vs, dp, vb, k0, kKeyTile, s.t, d);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kFwdRowsPerWarp; ++rr) {
      const int r = warp * kFwdRowsPerWarp + rr;
      const int64_t i = q0 + r;
      if (i >= s.t || k0 > i) continue;  // warp-uniform
      const int64_t j = k0 + lane;
      const float sc = j <= i ? scale * dot_smem(qs + r * d, ks + lane * dp, d) : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(sc));  // finite: key k0 ≤ i is in this tile
      const float alpha = expf(m[rr] - m_new);
      const float p = j <= i ? expf(sc - m_new) : 0.f;
      l[rr] = l[rr] * alpha + warp_sum(p);
      m[rr] = m_new;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) o[rr][c] *= alpha;
      const int jn = static_cast<int>(min64(kKeyTile, i - k0 + 1));  // keys ≤ i of the tile
      for (int jj = 0; jj < jn; ++jj) {
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
    if (i >= s.t) continue;
    const float inv = 1.f / l[rr];
    T* orow = out + (bh * s.t + i) * d;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int col = lane + kWarpSize * c;
      if (col < d) orow[col] = convert<T>(o[rr][c] * inv);
    }
    if (lane == 0) lse[bh * s.t + i] = m[rr] + logf(l[rr]);
  }
}

// Backward pre-pass: dvec_r = Σ_d dout_rd · out_rd for every row r of (B·Hq·T); a warp per row.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dot_kernel(const T* __restrict__ out, const T* __restrict__ dout,
                                  float* __restrict__ dvec, int64_t rows, int d) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarpSize; r < rows;
       r += step) {
    float acc = 0.f;
    for (int c = lane; c < d; c += kWarpSize) {
      acc = fmaf(convert<float>(dout[r * d + c]), convert<float>(out[r * d + c]), acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) dvec[r] = acc;
  }
}

// dk, dv: one block per (b, kv head, tile of kBwdRows keys), heaviest tiles first; warp w owns
// keys w·kBwdRowsPerWarp… . The block walks every query head of the group and every query tile
// (32 rows, one per lane) at or after its keys, in a fixed order, so dk and dv sum the group's
// heads deterministically with one writer per element.
template <typename T>
__global__ void __launch_bounds__(kThreads) attention_backward_dkv_kernel(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ dvec,
    T* __restrict__ dk, T* __restrict__ dv, AttnShape s, float scale, int64_t k_tiles) {
  extern __shared__ float attn_smem[];
  const int d = static_cast<int>(s.d), dp = d + 1;
  float* qs = attn_smem;            // (kKeyTile, d + 1) query rows of the tile
  float* dos = qs + kKeyTile * dp;  // (kKeyTile, d + 1) their dout rows
  float* ks = dos + kKeyTile * dp;  // (kBwdRows, d)
  float* vs = ks + kBwdRows * d;    // (kBwdRows, d)
  const int64_t tile = k_tiles - 1 - static_cast<int64_t>(blockIdx.x) % k_tiles;
  const int64_t bkv = static_cast<int64_t>(blockIdx.x) / k_tiles;  // b·Hkv + kv head
  const int64_t b = bkv / s.hkv, kvh = bkv % s.hkv;
  const int64_t k0 = tile * kBwdRows;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  load_rows(ks, d, k + bkv * s.t * d, k0, kBwdRows, s.t, d);
  load_rows(vs, d, v + bkv * s.t * d, k0, kBwdRows, s.t, d);

  float adk[kBwdRowsPerWarp][kChunks] = {}, adv[kBwdRowsPerWarp][kChunks] = {};
  for (int64_t hh = 0; hh < s.group; ++hh) {
    const int64_t bh = b * s.hq + kvh * s.group + hh;
    for (int64_t i0 = (k0 / kKeyTile) * kKeyTile; i0 < s.t; i0 += kKeyTile) {
      __syncthreads();  // the previous query tile is consumed (and ks, vs are written)
      load_rows(qs, dp, q + bh * s.t * d, i0, kKeyTile, s.t, d);
      load_rows(dos, dp, dout + bh * s.t * d, i0, kKeyTile, s.t, d);
      __syncthreads();
      const int64_t i = i0 + lane;
      const float lse_i = i < s.t ? lse[bh * s.t + i] : 0.f;
      const float dvec_i = i < s.t ? dvec[bh * s.t + i] : 0.f;
      const int ii_end = static_cast<int>(min64(kKeyTile, s.t - i0));
#pragma unroll
      for (int rr = 0; rr < kBwdRowsPerWarp; ++rr) {
        const int r = warp * kBwdRowsPerWarp + rr;
        const int64_t j = k0 + r;
        if (j >= s.t || j >= i0 + kKeyTile) continue;  // warp-uniform
        float p = 0.f, ds = 0.f;
        if (i >= j && i < s.t) {
          p = expf(scale * dot_smem(qs + lane * dp, ks + r * d, d) - lse_i);
          ds = p * (dot_smem(dos + lane * dp, vs + r * d, d) - dvec_i);
        }
        for (int ii = j > i0 ? static_cast<int>(j - i0) : 0; ii < ii_end; ++ii) {
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
    if (j >= s.t) continue;
    accumulate_row(dk + (bkv * s.t + j) * d, adk[rr], scale, d, lane);
    accumulate_row(dv + (bkv * s.t + j) * d, adv[rr], 1.f, d, lane);
  }
}

// dq: one block per (b, h, tile of kBwdRows query rows), heaviest tiles first; warp w owns rows
// w·kBwdRowsPerWarp… and walks the key tiles (32 keys, one per lane) up to its rows.
template <typename T>
__global__ void __launch_bounds__(kThreads) attention_backward_dq_kernel(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ dvec,
    T* __restrict__ dq, AttnShape s, float scale, int64_t q_tiles) {
  extern __shared__ float attn_smem[];
  const int d = static_cast<int>(s.d), dp = d + 1;
  float* ks = attn_smem;            // (kKeyTile, d + 1)
  float* vs = ks + kKeyTile * dp;   // (kKeyTile, d + 1)
  float* qs = vs + kKeyTile * dp;   // (kBwdRows, d)
  float* dos = qs + kBwdRows * d;   // (kBwdRows, d)
  const int64_t tile = q_tiles - 1 - static_cast<int64_t>(blockIdx.x) % q_tiles;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) / q_tiles;
  const int64_t kv = (bh / s.hq) * s.hkv + (bh % s.hq) / s.group;
  const int64_t q0 = tile * kBwdRows, q_end = min64(q0 + kBwdRows, s.t);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  load_rows(qs, d, q + bh * s.t * d, q0, kBwdRows, s.t, d);
  load_rows(dos, d, dout + bh * s.t * d, q0, kBwdRows, s.t, d);
  float lse_r[kBwdRowsPerWarp], dvec_r[kBwdRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kBwdRowsPerWarp; ++rr) {
    const int64_t i = q0 + warp * kBwdRowsPerWarp + rr;
    lse_r[rr] = i < s.t ? lse[bh * s.t + i] : 0.f;
    dvec_r[rr] = i < s.t ? dvec[bh * s.t + i] : 0.f;
  }
  float adq[kBwdRowsPerWarp][kChunks] = {};
  for (int64_t k0 = 0; k0 < q_end; k0 += kKeyTile) {
    __syncthreads();  // the previous key tile is consumed (and qs, dos are written)
    load_rows(ks, dp, k + kv * s.t * d, k0, kKeyTile, s.t, d);
    load_rows(vs, dp, v + kv * s.t * d, k0, kKeyTile, s.t, d);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kBwdRowsPerWarp; ++rr) {
      const int r = warp * kBwdRowsPerWarp + rr;
      const int64_t i = q0 + r;
      if (i >= s.t || k0 > i) continue;  // warp-uniform
      const int64_t j = k0 + lane;
      float ds = 0.f;
      if (j <= i) {
        const float p = expf(scale * dot_smem(qs + r * d, ks + lane * dp, d) - lse_r[rr]);
        ds = p * (dot_smem(dos + r * d, vs + lane * dp, d) - dvec_r[rr]);
      }
      const int jn = static_cast<int>(min64(kKeyTile, i - k0 + 1));
      for (int jj = 0; jj < jn; ++jj) {
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
    if (i < s.t) accumulate_row(dq + (bh * s.t + i) * d, adq[rr], scale, d, lane);
  }
}

// ---- launchers ---------------------------------------------------------------------------

AttnShape attn_shape(const Tensor& q, const Tensor& k, const Tensor& v, const char* name) {
  LOOM_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape(), name,
             ": q must be (B, Hq, T, D) and k, v (B, Hkv, T, D), got ", shape_str(q.shape()), ", ",
             shape_str(k.shape()), ", ", shape_str(v.shape()));
  AttnShape s{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3), 1};
  LOOM_CHECK(
      k.size(0) == s.b && k.size(2) == s.t && k.size(3) == s.d && s.hkv > 0 && s.hq % s.hkv == 0,
      name, ": q ", shape_str(q.shape()), " and k ", shape_str(k.shape()), " do not match");
  s.group = s.hq / s.hkv;
  LOOM_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), name,
             ": tensors must be contiguous");
  LOOM_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), name, ": dtypes differ");
  LOOM_CHECK(q.dtype() == DType::kF32 || q.dtype() == DType::kBF16 || q.dtype() == DType::kF16,
             name, ": dtype ", dtype_name(q.dtype()), " not supported on cuda (f32, bf16, f16)");
  LOOM_CHECK(s.d <= kMaxD, name, ": head size ", s.d, " above ", kMaxD, " not supported on cuda");
  return s;
}

void check_like(const Tensor& t, const Shape& shape, DType dtype, const char* name,
                const char* what) {
  LOOM_CHECK(t.shape() == shape && t.dtype() == dtype && t.is_contiguous(), name, ": ", what,
             " must be contiguous ", shape_str(shape), " ", dtype_name(dtype), ", got ",
             shape_str(t.shape()), " ", dtype_name(t.dtype()));
}

template <typename T>
void forward_general(const Tensor& q, const Tensor& k, const Tensor& v, const AttnShape& s,
                     float scale, Tensor& out, Tensor& lse) {
  const int64_t q_tiles = (s.t + kFwdRows - 1) / kFwdRows;
  const unsigned grid = attention_grid(s.b * s.hq, q_tiles, "attention_forward");
  const size_t smem = attention_smem_bytes(2 * kKeyTile, kFwdRows, s.d);
  attention_forward_kernel<T><<<grid, kThreads, smem, compute_stream()>>>(
      q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(), lse.data<float>(), s, scale, q_tiles);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <typename T>
void backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      const Tensor& lse, const Tensor& dout, const AttnShape& s, float scale,
                      Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t rows = s.b * s.hq * s.t;
  Tensor dvec = Tensor::empty({rows}, DType::kF32, q.device());  // (B·Hq·T) Σ dout·out
  attention_backward_dot_kernel<T>
      <<<grid_for(rows * kWarpSize, kThreads), kThreads, 0, compute_stream()>>>(
          out.data<T>(), dout.data<T>(), dvec.data<float>(), rows, static_cast<int>(s.d));
  LOOM_CUDA_LAUNCH_CHECK();
  if (attention_backward_mma_supported(q, k, v, dout, dq, dk, dv, s)) {
    attention_backward_mma(q, k, v, dout, lse, dvec, s, scale, dq, dk, dv);
    return;
  }
  const size_t smem = attention_smem_bytes(2 * kKeyTile, 2 * kBwdRows, s.d);
  const int64_t tiles = (s.t + kBwdRows - 1) / kBwdRows;
  const unsigned dkv_grid = attention_grid(s.b * s.hkv, tiles, "attention_backward");
  attention_backward_dkv_kernel<T><<<dkv_grid, kThreads, smem, compute_stream()>>>(
          q.data<T>(), k.data<T>(), v.data<T>(), dout.data<T>(), lse.data<float>(),
          dvec.data<float>(), dk.data<T>(), dv.data<T>(), s, scale, tiles);
  LOOM_CUDA_LAUNCH_CHECK();
  const unsigned dq_grid = attention_grid(s.b * s.hq, tiles, "attention_backward");
  attention_backward_dq_kernel<T><<<dq_grid, kThreads, smem, compute_stream()>>>(
          q.data<T>(), k.data<T>(), v.data<T>(), dout.data<T>(), lse.data<float>(),
          dvec.data<float>(), dq.data<T>(), s, scale, tiles);
  LOOM_CUDA_LAUNCH_CHECK();
}

void attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                            Tensor& out, Tensor& lse) {
  const char* name = "attention_forward";
  const AttnShape s = attn_shape(q, k, v, name);
  check_like(out, q.shape(), q.dtype(), name, "out");
  check_like(lse, {s.b, s.hq, s.t}, DType::kF32, name, "lse");
  LOOM_CHECK(scale > 0, name, ": scale must be positive, got ", scale);
  if (q.numel() == 0) return;
  CudaDeviceGuard guard(q.device().index);
  const float sc = static_cast<float>(scale);
  if (attention_forward_mma_supported(q, k, v, out, s)) {
    attention_forward_mma(q, k, v, s, sc, out, lse);
    return;
  }
  switch (q.dtype()) {
    case DType::kBF16: return forward_general<BFloat16>(q, k, v, s, sc, out, lse);
    case DType::kF16: return forward_general<Float16>(q, k, v, s, sc, out, lse);
    default: return forward_general<float>(q, k, v, s, sc, out, lse);
  }
}

void attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, const Tensor& dout, double scale, Tensor& dq,
                             Tensor& dk, Tensor& dv) {
  const char* name = "attention_backward";
  const AttnShape s = attn_shape(q, k, v, name);
  check_like(out, q.shape(), q.dtype(), name, "out");
  check_like(dout, q.shape(), q.dtype(), name, "dout");
  check_like(lse, {s.b, s.hq, s.t}, DType::kF32, name, "lse");
  check_like(dq, q.shape(), q.dtype(), name, "dq");
  check_like(dk, k.shape(), q.dtype(), name, "dk");
  check_like(dv, v.shape(), q.dtype(), name, "dv");
  LOOM_CHECK(scale > 0, name, ": scale must be positive, got ", scale);
  if (q.numel() == 0) return;
  CudaDeviceGuard guard(q.device().index);
  const float sc = static_cast<float>(scale);
  switch (q.dtype()) {
    case DType::kBF16: return backward_typed<BFloat16>(q, k, v, out, lse, dout, s, sc, dq, dk, dv);
    case DType::kF16: return backward_typed<Float16>(q, k, v, out, lse, dout, s, sc, dq, dk, dv);
    default: return backward_typed<float>(q, k, v, out, lse, dout, s, sc, dq, dk, dv);
  }
}

}  // namespace

LOOM_REGISTER_KERNEL(attention_forward, kCuda, attention_forward_cuda);
LOOM_REGISTER_KERNEL(attention_backward, kCuda, attention_backward_cuda);

}  // namespace loom::kernels::cuda
