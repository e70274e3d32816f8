// core/ops/elementwise.h — differentiable arithmetic with NumPy broadcasting, and the in-place
// accumulation used by the autograd engine and optimisers (not differentiable).
#pragma once

#include "core/tensor.h"

namespace loom::ops {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double alpha);

// acc += alpha · x in place (acc contiguous, same shape). Records nothing.
void add_(Tensor& acc, const Tensor& x, double alpha = 1.0);

// The shape both operands broadcast to; names the op on mismatch.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace loom::ops
