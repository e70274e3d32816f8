// core/ops/matmul.h — differentiable matrix products with optional transposes, and the fused
// Linear forms (x·wᵀ + b, optionally followed by GELU) that run as one GEMM with an epilogue.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// op(a) · op(b), where op transposes the last two dims when its flag is set.
//  - a (…, M, K) with b (K, N): the leading dims of a are folded into M (one GEMM; this is the
//    Linear layer's form, e.g. matmul(x, w, false, true) for x·wᵀ).
//  - a (B, M, K) with b (B, K, N): batched (leading dims folded into one batch dim).
// Transposed views of contiguous tensors are passed to BLAS without a copy.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// The Linear layer's product: x (…, in), w (out, in) as layers/linear.h stores it, bias (out)
// or undefined → x·wᵀ + bias, shape (…, out), one GEMM with the bias fused (kernel gemm_bias).
// Equal to add(matmul(x, w, false, true), bias) up to rounding; differentiable in all three.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);
// gelu(x·wᵀ + bias) (tanh form, as ops::gelu) as one GEMM with a bias+GELU epilogue (kernel
// gemm_bias_gelu), saving the pre-activation for the backward. bias is required.
Tensor linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias);
// GPT-2's feed-forward block as one op: linear(gelu(linear(x, w_fc, b_fc)), w_proj, b_proj),
// x (…, C), w_fc (H, C), b_fc (H), w_proj (C, H), b_proj (C) → (…, C). Forward: the
// bias+GELU and bias epilogues (gemm_bias_gelu, gemm_bias); backward: the GELU derivative and
// the fc bias gradient fused into the GEMM that brings the hidden gradient (gemm_dgelu_bgrad,
// as llm.c does), then the weight GEMMs. Saves x and pre only: gelu(pre) is recomputed in the
// backward (one element-wise pass) — an (…, H) activation less per layer than the unfused
// layers keep. Differentiable in all five.
Tensor gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj,
                const Tensor& b_proj);

}  // namespace loom::ops
