// kernels/cuda/attention.cuh — what the CUDA attention files share: the problem shape and the
// tensor-core (mma.sync) paths' entry points, called by the launchers in attention.cu.
// Included only by kernels/cuda/attention*.cu; declares no kernels of its own and holds no
// state. The kernel contract is Note [Attention kernel contract] in kernels/attention.h; the
// algorithm and tiles are described in docs/cuda_attention.md.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace loom::kernels::cuda {

// q (B, Hq, T, D); k, v (B, Hkv, T, D); query head h reads kv head h / group.
struct AttnShape {
  int64_t b, hq, hkv, t, d, group;
};

// True when the tensor-core forward takes this call: bf16 or f16, D ∈ {64, 128}, and every
// buffer 16-byte aligned (cp.async copies 16 bytes at a time).
bool attention_forward_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const AttnShape& s);

// The tensor-core forward: out (B,Hq,T,D) in q's dtype, lse (B,Hq,T) f32. Call only when
// attention_forward_mma_supported() holds, inside the caller's CudaDeviceGuard.
void attention_forward_mma(const Tensor& q, const Tensor& k, const Tensor& v, const AttnShape& s,
                           float scale, Tensor& out, Tensor& lse);

// True when the tensor-core backward takes this call: bf16 or f16, D = 64, and every buffer
// 16-byte aligned.
bool attention_backward_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& dout, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv, const AttnShape& s);

// The tensor-core backward: accumulates into dq (B,Hq,T,D), dk, dv (B,Hkv,T,D) from the saved
// lse (B,Hq,T) f32 and dvec (B·Hq·T) f32 = Σ_d dout·out per row. Call only when
// attention_backward_mma_supported() holds, inside the caller's CudaDeviceGuard.
void attention_backward_mma(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                            const Tensor& lse, const Tensor& dvec, const AttnShape& s, float scale,
                            Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace loom::kernels::cuda
