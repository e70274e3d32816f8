// core/ops/activation.h — differentiable activations: GELU (tanh approximation, as GPT-2), SiLU,
// and the fused SwiGLU gate of LLaMA MLPs. Element-wise; outputs have the input's shape.
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
Tensor gelu(const Tensor& x);
// x·σ(x)
Tensor silu(const Tensor& x);
// silu(gate) · up; gate and up have the same shape and dtype (no broadcasting).
Tensor swiglu(const Tensor& gate, const Tensor& up);

}  // namespace loom::ops
