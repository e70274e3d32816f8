// kernels/adamw.h — the fused AdamW update: one pass over a parameter updates its two moment
// buffers and the parameter itself. Holds no policy (bias-correction terms, which parameters
// decay): the optimiser in optim/adamw.cpp decides those and calls this once per parameter.
#pragma once

#include "kernels/registry.h"

// For each element i, with t = step (1 for the first update):
//   param[i]      *= 1 - lr · weight_decay                      (decoupled decay; 0 disables)
//   exp_avg[i]     = beta1 · exp_avg[i] + (1 - beta1) · grad[i]
//   exp_avg_sq[i]  = beta2 · exp_avg_sq[i] + (1 - beta2) · grad[i]²
//   param[i]      -= lr / (1 - beta1^t) · exp_avg[i] / (sqrt(exp_avg_sq[i] / (1 - beta2^t)) + eps)
// All four tensors are contiguous, of one shape and one floating dtype (f32 or f64); the
// arithmetic is done in that dtype (scalars computed in double first). Element-wise, so the
// result does not depend on the thread count.
LOOM_DECLARE_KERNEL(adamw_step,
                    void(loom::Tensor& param, const loom::Tensor& grad, loom::Tensor& exp_avg,
                         loom::Tensor& exp_avg_sq, double lr, double beta1, double beta2,
                         double eps, double weight_decay, int64_t step));
