// kernels/softmax.h — softmax over the last dimension, forward and backward. Tensors are
// contiguous, read as (N, C) with C = size(-1). The backward kernel accumulates (dx += …).
#pragma once

#include "kernels/registry.h"

// y = exp(x − max_C x) / Σ_C exp(x − max_C x)   (row max subtracted: no overflow)
LOOM_DECLARE_KERNEL(softmax_forward, void(const loom::Tensor& x,  // x (N, C)
                                          loom::Tensor& y));      // y (N, C)
// dx += y · (dy − Σ_C dy·y)
LOOM_DECLARE_KERNEL(softmax_backward, void(const loom::Tensor& y,   // y (N, C)
                                           const loom::Tensor& dy,  // dy (N, C)
                                           loom::Tensor& dx));      // dx (N, C)
