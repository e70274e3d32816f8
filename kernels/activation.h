// kernels/activation.h — element-wise activation kernels: GELU (tanh form, as GPT-2), SiLU and
// SwiGLU. Every tensor is contiguous, with one shape and one dtype; backward kernels accumulate
// into their gradient outputs (dx += …) and never allocate.
#pragma once

#include "kernels/registry.h"

// y = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
LOOM_DECLARE_KERNEL(gelu_forward, void(const loom::Tensor& x,  // x (n)
                                       loom::Tensor& y));      // y (n)
// dx += dy · gelu'(x)
LOOM_DECLARE_KERNEL(gelu_backward, void(const loom::Tensor& x,   // x (n)
                                        const loom::Tensor& dy,  // dy (n)
                                        loom::Tensor& dx));      // dx (n)

// y = x · σ(x)
LOOM_DECLARE_KERNEL(silu_forward, void(const loom::Tensor& x,  // x (n)
                                       loom::Tensor& y));      // y (n)
// dx += dy · σ(x)·(1 + x·(1 − σ(x)))
LOOM_DECLARE_KERNEL(silu_backward, void(const loom::Tensor& x,   // x (n)
                                        const loom::Tensor& dy,  // dy (n)
                                        loom::Tensor& dx));      // dx (n)

// y = silu(gate) · up
LOOM_DECLARE_KERNEL(swiglu_forward, void(const loom::Tensor& gate,  // gate (n)
                                         const loom::Tensor& up,    // up (n)
                                         loom::Tensor& y));         // y (n)
// dgate += dy · up · silu'(gate);  dup += dy · silu(gate)
LOOM_DECLARE_KERNEL(swiglu_backward, void(const loom::Tensor& gate,  // gate (n)
                                          const loom::Tensor& up,    // up (n)
                                          const loom::Tensor& dy,    // dy (n)
                                          loom::Tensor& dgate,       // dgate (n)
                                          loom::Tensor& dup));       // dup (n)
