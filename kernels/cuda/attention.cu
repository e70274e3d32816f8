// kernels/cuda/attention.cu — CUDA causal attention (Note [Attention kernel contract] in
// kernels/attention.h): the registered launchers, and the general path for every case the
// tensor-core kernels (attention_mma*.cu) do not take: f32, and bf16/f16 with other head sizes
// (forward: D not 64 or 128; backward: D not 64); also the backward's Dᵢ pre-pass. The general
// path computes in f32 with FMAs on tiles staged in shared memory; no T×T buffer exists
// anywhere. Every output element has exactly one writer and a fixed summation order, so
// results do not depend on the launch order (no atomics). Work runs on the compute stream;
// nothing here synchronises the host. See docs/cuda_attention.md. The general path is ring
// attention's block kernels (attention_block.cu) with Tq = Tk and no shift: one kernel family
// for both. A thread that asked for cuDNN's attention gets it where cuDNN handles the case
// (attention_cudnn.cpp, Note [cuDNN attention] in kernels/attention.h), except with packed
// documents' doc_start, which Loom's kernels (both paths) handle (Note [Packed documents]).
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

// doc_start's device data, or null when undefined (shape and dtype checked; the contiguity rule
// is the caller's: checking it would read the device).
const int32_t* doc_starts(const Tensor& doc_start, const Tensor& q, const AttnShape& s,
                          const char* name) {
  check_doc_start(doc_start, s.t, name);
  if (!doc_start.defined()) return nullptr;
  LOOM_CHECK(doc_start.device() == q.device(), name, ": doc_start on ", doc_start.device().str(),
             ", q on ", q.device().str());
  return doc_start.data<int32_t>();
}

template <typename T>
void backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const int32_t* doc_start,
                    const Tensor& out, const Tensor& lse, const Tensor& dout, const AttnShape& s,
                    float scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t rows = s.b * s.hq * s.t;
  Tensor dvec = Tensor::empty({s.b, s.hq, s.t}, DType::kF32, q.device());  // Σ dout·out per row
  attention_backward_dot_kernel<T>
      <<<grid_for(rows * kWarpSize, kThreads), kThreads, 0, compute_stream()>>>(
          out.data<T>(), dout.data<T>(), dvec.data<float>(), rows, static_cast<int>(s.d));
  LOOM_CUDA_LAUNCH_CHECK();
  if (attention_backward_mma_supported(q, k, v, dout, dq, dk, dv, s)) {
    attention_backward_mma(q, k, v, doc_start, dout, lse, dvec, s, scale, dq, dk, dv);
    return;
  }
  block_attention_backward(q, k, v, lse, dvec, dout, doc_start, self_block(s), scale, dq, dk, dv);
}

void attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& doc_start, double scale, Tensor& out, Tensor& lse) {
  const char* name = "attention_forward";
  const AttnShape s = attn_shape(q, k, v, name);
  const int32_t* ds = doc_starts(doc_start, q, s, name);
  check_like(out, q.shape(), q.dtype(), name, "out");
  check_like(lse, {s.b, s.hq, s.t}, DType::kF32, name, "lse");
  LOOM_CHECK(scale > 0, name, ": scale must be positive, got ", scale);
  if (q.numel() == 0) return;
  CudaDeviceGuard guard(q.device().index);
  const float sc = static_cast<float>(scale);
  if (!ds && cudnn_attention_takes({&q, &k, &v, &out, &lse}, s, q.dtype())) {
    cudnn_attention_forward(q, k, v, s, sc, out, lse);
    return;
  }
  if (attention_forward_mma_supported(q, k, v, out, s)) {
    attention_forward_mma(q, k, v, ds, s, sc, out, lse);
    return;
  }
  block_attention_forward(q, k, v, ds, self_block(s), sc, out, lse);  // the general kernels
}

void attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& doc_start, const Tensor& out, const Tensor& lse,
                             const Tensor& dout, double scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  const char* name = "attention_backward";
  const AttnShape s = attn_shape(q, k, v, name);
  const int32_t* ds = doc_starts(doc_start, q, s, name);
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
  if (!ds && cudnn_attention_takes({&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv}, s, q.dtype())) {
    cudnn_attention_backward(q, k, v, out, lse, dout, s, sc, dq, dk, dv);
    return;
  }
  switch (q.dtype()) {
    case DType::kBF16:
      return backward_typed<BFloat16>(q, k, v, ds, out, lse, dout, s, sc, dq, dk, dv);
    case DType::kF16:
      return backward_typed<Float16>(q, k, v, ds, out, lse, dout, s, sc, dq, dk, dv);
    default:
      return backward_typed<float>(q, k, v, ds, out, lse, dout, s, sc, dq, dk, dv);
  }
}

}  // namespace

LOOM_REGISTER_KERNEL(attention_forward, kCuda, attention_forward_cuda);
LOOM_REGISTER_KERNEL(attention_backward, kCuda, attention_backward_cuda);

}  // namespace loom::kernels::cuda
