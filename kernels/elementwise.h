// kernels/elementwise.h — binary arithmetic on broadcast operands, scaling, and y += αx.
#pragma once

#include "kernels/registry.h"

namespace loom::kernels {
enum class BinaryOp : int8_t { kAdd, kSub, kMul, kDiv };
}

// out = a ∘ b; a and b are already expanded to out's shape (stride 0 where broadcast).
LOOM_DECLARE_KERNEL(binary_forward, void(loom::kernels::BinaryOp op, const loom::Tensor& a,
                                         const loom::Tensor& b, loom::Tensor& out));
// out = alpha · x (same shape; x any strides, out contiguous).
LOOM_DECLARE_KERNEL(scale_forward, void(const loom::Tensor& x, double alpha, loom::Tensor& out));
// y += alpha · x (same shape; x any strides, y contiguous). The accumulation primitive.
LOOM_DECLARE_KERNEL(axpy, void(double alpha, const loom::Tensor& x, loom::Tensor& y));
