// core/ops/rope.h — rotary position embedding (rotate-half pairing, GPT-NeoX / Hugging Face
// Llama). A differentiable op; the math is Note [RoPE pairing] in kernels/rope.h.
#pragma once

#include "core/tensor.h"
#include "kernels/rope.h"

namespace loom::ops {

// x (B, T, H, D) with D even; positions (T) integer (i32 or i64, any strides): the global index
// of each token, so context-parallel ranks pass their own slice; f: the D/2 frequencies and the
// scale (a model's: layers/rope_scaling.h). Returns y (B, T, H, D), x's dtype. Differentiable
// in x.
Tensor rope(const Tensor& x, const Tensor& positions, const kernels::RopeFrequencies& f);
// The plain RoPE of base theta.
Tensor rope(const Tensor& x, const Tensor& positions, double theta = 10000.0);

}  // namespace loom::ops
