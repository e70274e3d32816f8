// core/ops/norm.h — differentiable LayerNorm and RMSNorm over the last dimension, and the residual
// add fused with the LayerNorm after it; each one fused kernel per direction. The row statistics
// are saved for backward (and, for the residual form, the sum); nothing else is.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// (x − mean)/√(var + eps) · weight + bias over the last dim. x (…, C); weight (C); bias (C) or an
// undefined Tensor for no bias. Gradients flow to x, weight and bias.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// x/√(mean(x²) + eps) · weight over the last dim. x (…, C); weight (C).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-5);

// The two outputs of residual_layer_norm.
struct ResidualLayerNorm {
  Tensor sum;         // x + r: the new residual stream
  Tensor normalized;  // layer_norm(x + r, weight, bias, eps)
};
// x + r and its LayerNorm in one pass (a transformer block's residual add and the next norm).
// x, r (…, C) of the same shape and dtype; weight (C); bias (C) or undefined. Gradients flow to
// x, r, weight and bias from both outputs.
ResidualLayerNorm residual_layer_norm(const Tensor& x, const Tensor& r, const Tensor& weight,
                                      const Tensor& bias, double eps = 1e-5);

}  // namespace loom::ops
