// kernels/cuda/attention.cuh — what the CUDA attention files share: the problem shapes, the
// general (CUDA-core) block kernels' entry points (attention_block.cu; causal self-attention is
// the block case Tq = Tk, shift 0), and the tensor-core (mma.sync) paths' entry points, called
// by the launchers in attention.cu, and cuDNN's fused attention (attention_cudnn.cpp).
// Included only by kernels/cuda/attention*; declares no kernels of its own and holds no
// state. The kernel contract is Note [Attention kernel contract] in kernels/attention.h; the
// algorithm and tiles are described in docs/cuda_attention.md.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/tensor.h"

namespace loom::kernels::cuda {

// q (B, Hq, T, D); k, v (B, Hkv, T, D); query head h reads kv head h / group.
struct AttnShape {
  int64_t b, hq, hkv, t, d, group;
};

// q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D); query head h reads kv head h / group. Query row i sees
// key row j iff j ≤ i + shift, shift = q_offset − k_offset (global positions).
struct BlockShape {
  int64_t b, hq, hkv, tq, tk, d, group, shift;
};

// Causal self-attention as a block: Tq = Tk = T, shift 0.
inline BlockShape self_block(const AttnShape& s) {
  return {s.b, s.hq, s.hkv, s.t, s.t, s.d, s.group, 0};
}

// Whether x's data starts on a 16-byte boundary (the tensor-core paths copy 16 bytes at a time;
// cuDNN asks for it too).
inline bool aligned16(const Tensor& x) {
  return reinterpret_cast<uintptr_t>(x.raw_data()) % 16 == 0;
}

// t must be contiguous `shape` of `dtype` (the launchers' output and buffer checks).
inline void check_like(const Tensor& t, const Shape& shape, DType dtype, const char* name,
                       const char* what) {
  LOOM_CHECK(t.shape() == shape && t.dtype() == dtype && t.is_contiguous(), name, ": ", what,
             " must be contiguous ", shape_str(shape), " ", dtype_name(dtype), ", got ",
             shape_str(t.shape()), " ", dtype_name(t.dtype()));
}

// The general kernels (attention_block.cu), f32 math for f32/bf16/f16 storage, D ≤ kMaxD, tensors
// checked by the caller, inside its CudaDeviceGuard, Tq > 0 and Tk > 0:
//   forward: out (B,Hq,Tq,D), lse (B,Hq,Tq) f32 of the block (a row that sees no key: out 0,
//            lse −inf);
//   backward: accumulates the block pair's share into dq, dk, dv from the full rows' lse and
//            delta = Σ_d dout·out (B,Hq,Tq) f32.
// doc_start: null, or packed documents' (Tq) i32 on the device (Note [Packed documents] in
// kernels/attention.h), only for a self block (Tq = Tk, shift 0; checked).
void block_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                             const int32_t* doc_start, const BlockShape& s, float scale,
                             Tensor& out, Tensor& lse);
void block_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                              const Tensor& delta, const Tensor& dout, const int32_t* doc_start,
                              const BlockShape& s, float scale, Tensor& dq, Tensor& dk, Tensor& dv);

// True when the tensor-core forward takes this call: bf16 or f16, D ∈ {64, 128}, and every
// buffer 16-byte aligned (cp.async copies 16 bytes at a time).
bool attention_forward_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const AttnShape& s);

// The tensor-core forward: out (B,Hq,T,D) in q's dtype, lse (B,Hq,T) f32; doc_start null or
// packed documents' (T) i32 on the device. Call only when attention_forward_mma_supported()
// holds, inside the caller's CudaDeviceGuard.
void attention_forward_mma(const Tensor& q, const Tensor& k, const Tensor& v,
                           const int32_t* doc_start, const AttnShape& s, float scale, Tensor& out,
                           Tensor& lse);

// True when the tensor-core backward takes this call: bf16 or f16, D = 64, and every buffer
// 16-byte aligned.
bool attention_backward_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& dout, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv, const AttnShape& s);

// The tensor-core backward: accumulates into dq (B,Hq,T,D), dk, dv (B,Hkv,T,D) from the saved
// lse (B,Hq,T) f32 and dvec (B·Hq·T) f32 = Σ_d dout·out per row; doc_start as the forward's.
// Call only when attention_backward_mma_supported() holds, inside the caller's CudaDeviceGuard.
void attention_backward_mma(const Tensor& q, const Tensor& k, const Tensor& v,
                            const int32_t* doc_start, const Tensor& dout, const Tensor& lse,
                            const Tensor& dvec, const AttnShape& s, float scale, Tensor& dq,
                            Tensor& dk, Tensor& dv);

// cuDNN's fused attention (attention_cudnn.cpp, Note [cuDNN attention] in kernels/attention.h).
// True when it takes this call: the thread asked for it, this build has it, it handles the dtype,
// T and head size, and every buffer is 16-byte aligned.
bool cudnn_attention_takes(std::initializer_list<const Tensor*> buffers, const AttnShape& s,
                           DType dtype);

// The two passes with the contract's semantics (lse written; dq, dk, dv accumulated into). Call
// only when cudnn_attention_takes() holds, inside the caller's CudaDeviceGuard.
void cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttnShape& s,
                             float scale, Tensor& out, Tensor& lse);
void cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const Tensor& dout, const AttnShape& s,
                              float scale, Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace loom::kernels::cuda
