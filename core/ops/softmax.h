// core/ops/softmax.h — differentiable, numerically stable softmax over the last dimension.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// exp(x − max) / Σ exp(x − max) along the last dim; the output has x's shape.
Tensor softmax(const Tensor& x);

}  // namespace loom::ops
