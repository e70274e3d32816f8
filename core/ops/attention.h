// core/ops/attention.h — causal scaled-dot-product attention with grouped-query support, as one
// fused differentiable op (flash-style: only per-row log-sum-exp is saved for backward; see
// Note [Attention kernel contract] in kernels/attention.h).
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// q (B, Hq, T, D); k, v (B, Hkv, T, D) with Hq a multiple of Hkv (query head h uses kv head
// h / (Hq / Hkv); Hq == Hkv is plain multi-head). Row i attends to positions j ≤ i with
// weights softmax(scale · q_i·k_j); scale <= 0 means 1/sqrt(D). Returns out (B, Hq, T, D).
// Differentiable in q, k and v.
// doc_start (T) i32, shared by every batch row, packs documents (Note [Packed documents] in
// kernels/attention.h): row i then attends only to doc_start[i] ≤ j ≤ i. Undefined: plain
// causal. On the host it is checked (shape, dtype, doc_start[0] = 0 and doc_start[i] ∈
// {doc_start[i−1], i}) and uploaded to q's device; on q's device only its shape and dtype are
// checked. It is saved for backward.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0.0,
                        const Tensor& doc_start = {});

}  // namespace loom::ops
