// kernels/matmul.h — GEMM: c = alpha · op(a) · op(b) + beta · c, plain or batched.
#pragma once

#include "kernels/registry.h"

// a, b, c are 2-d, or 3-d with equal batch sizes. Each matrix's last dim has stride 1 and its
// rows stride(-2) apart (so transposed operands are passed as-is, with the flag). op(a) is
// (M, K), op(b) is (K, N), c is (M, N) and contiguous.
LOOM_DECLARE_KERNEL(gemm, void(const loom::Tensor& a, const loom::Tensor& b, loom::Tensor& c,
                               bool trans_a, bool trans_b, double alpha, double beta));
