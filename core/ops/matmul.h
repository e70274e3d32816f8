// core/ops/matmul.h — differentiable matrix products with optional transposes.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// op(a) · op(b), where op transposes the last two dims when its flag is set.
//  - a (…, M, K) with b (K, N): the leading dims of a are folded into M (one GEMM; this is the
//    Linear layer's form, e.g. matmul(x, w, false, true) for x·wᵀ).
//  - a (B, M, K) with b (B, K, N): batched (leading dims folded into one batch dim).
// Transposed views of contiguous tensors are passed to BLAS without a copy.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

}  // namespace loom::ops
