// kernels/attention.h — causal scaled-dot-product attention kernels, flash-style: the forward
// keeps only per-row softmax statistics (lse) and the backward recomputes probabilities from
// them, so no backend ever stores a T×T matrix. Kernels allocate nothing they return, and
// their results do not depend on the thread count (or, on CUDA, on the launch order).
#pragma once

#include "kernels/registry.h"

// Note [Attention kernel contract]: the same signatures serve the CPU kernels and a CUDA
// flash kernel.
//   q    (B, Hq, T, D)   contiguous
//   k, v (B, Hkv, T, D)  contiguous; Hq % Hkv == 0; query head h reads kv head h / (Hq / Hkv)
//   out  (B, Hq, T, D)   contiguous, written (not accumulated)
//   lse  (B, Hq, T)      contiguous: lse_i = log Σ_{j≤i} exp(s_ij), s_ij = scale · q_i·k_j.
//                        Its dtype is q's for f32/f64 and f32 for 16-bit q.
// Row i attends to columns j ≤ i (causal). scale > 0 is applied to the scores.
// Backward, from the saved q, k, v, out, lse and the incoming dout (B, Hq, T, D):
//   D_i = Σ_d dout_id · out_id          p_ij  = exp(s_ij − lse_i)
//   dv_j += Σ_i p_ij dout_i             dp_ij = dout_i · v_j
//   ds_ij = p_ij (dp_ij − D_i)
//   dq_i += scale Σ_j ds_ij k_j         dk_j += scale Σ_i ds_ij q_i
// dq, dk, dv have q's, k's and v's shapes, are contiguous and are ACCUMULATED into. The sums
// over query heads sharing a kv head (grouped-query) land in that kv head's dk, dv.

LOOM_DECLARE_KERNEL(attention_forward,
                    void(const loom::Tensor& q, const loom::Tensor& k, const loom::Tensor& v,
                         double scale, loom::Tensor& out, loom::Tensor& lse));
LOOM_DECLARE_KERNEL(attention_backward,
                    void(const loom::Tensor& q, const loom::Tensor& k, const loom::Tensor& v,
                         const loom::Tensor& out, const loom::Tensor& lse, const loom::Tensor& dout,
                         double scale, loom::Tensor& dq, loom::Tensor& dk, loom::Tensor& dv));
