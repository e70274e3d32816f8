// core/ops/reduce.h — differentiable sums and means, and sum_to_shape (the adjoint of
// broadcasting, used by every broadcasting op's backward).
#pragma once

#include "core/tensor.h"

namespace loom::ops {

Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor sum(const Tensor& x);   // all elements → 0-d tensor
Tensor mean(const Tensor& x);  // all elements → 0-d tensor
// Σ x² over all elements as a 0-d f64 tensor (gradient norms); its gradient is 2x.
Tensor sum_squares(const Tensor& x);
// Sums x down to `shape`, which x's shape must broadcast from.
Tensor sum_to_shape(const Tensor& x, const Shape& shape);

}  // namespace loom::ops
