// core/ops/norm.h — differentiable LayerNorm and RMSNorm over the last dimension, each one fused
// kernel per direction. The row statistics are saved for backward; nothing else is.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// (x − mean)/√(var + eps) · weight + bias over the last dim. x (…, C); weight (C); bias (C) or an
// undefined Tensor for no bias. Gradients flow to x, weight and bias.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// x/√(mean(x²) + eps) · weight over the last dim. x (…, C); weight (C).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-5);

}  // namespace loom::ops
