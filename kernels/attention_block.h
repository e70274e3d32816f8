// kernels/attention_block.h — causal attention between one block of queries and one block of
// keys/values that sit at arbitrary positions of a longer sequence: the pieces ring attention
// (context parallelism, parallel/cp) combines. Causality is by GLOBAL position: query row i (at
// q_offset + i) sees key row j (at k_offset + j) iff k_offset + j ≤ q_offset + i. Kernels
// allocate nothing and their results do not depend on the thread count.
//
// Note [Attention block kernel contract]:
//   q    (B, Hq, Tq, D)   contiguous;  k, v (B, Hkv, Tk, D) contiguous; Hq % Hkv == 0
//   out  (B, Hq, Tq, D)   written: this block's softmax-weighted sum, normalised within the block
//   lse  (B, Hq, Tq)      written: log Σ_{visible j} exp(scale·q_i·k_j), −inf where no key is
//                         visible (then out's row is 0); dtype as q for f32/f64 and f32 for
//                         16-bit q (as attention's lse); delta has lse's dtype too
// Backends: CPU f32/f64 (kernels/cpu/attention_block.cpp), CUDA f32/bf16/f16 with f32 math
// (kernels/cuda/attention_block.cu, D ≤ 128).
// Partial results of several key blocks merge exactly: lse = log Σ_b exp(lse_b) and
// out = Σ_b exp(lse_b − lse)·out_b.
// Backward, with the FINAL lse (over all key blocks) and delta_i = Σ_d dout_id·out_id of the
// FINAL output, accumulates this block's share: p_ij = exp(scale·q_i·k_j − lse_i) on visible
// pairs, ds_ij = p_ij (dout_i·v_j − delta_i), dq_i += scale Σ_j ds_ij k_j,
// dk_j += scale Σ_i ds_ij q_i, dv_j += Σ_i p_ij dout_i (grouped heads summed into their kv head).
#pragma once

#include <cstdint>

#include "kernels/registry.h"

LOOM_DECLARE_KERNEL(attention_block_forward,
                    void(const loom::Tensor& q, const loom::Tensor& k, const loom::Tensor& v,
                         int64_t q_offset, int64_t k_offset, double scale, loom::Tensor& out,
                         loom::Tensor& lse));
// Merges a block's partial result into a running one, in place: lse ← log(e^lse + e^block_lse),
// out ← e^(lse_old − lse)·out + e^(block_lse − lse)·block_out (rows whose block_lse is −inf are
// left as they are). out/block_out (B, Hq, Tq, D), lse/block_lse (B, Hq, Tq) in the lse dtype
// above, all contiguous.
LOOM_DECLARE_KERNEL(attention_block_merge,
                    void(loom::Tensor& out, loom::Tensor& lse, const loom::Tensor& block_out,
                         const loom::Tensor& block_lse));
LOOM_DECLARE_KERNEL(attention_block_backward,
                    void(const loom::Tensor& q, const loom::Tensor& k, const loom::Tensor& v,
                         const loom::Tensor& lse, const loom::Tensor& delta,
                         const loom::Tensor& dout, int64_t q_offset, int64_t k_offset, double scale,
                         loom::Tensor& dq, loom::Tensor& dk, loom::Tensor& dv));
