// kernels/rope.h — rotary position embedding kernels (rotate-half pairing, as in GPT-NeoX and
// Hugging Face Llama). Kernels only read and write the buffers they are given; they allocate
// no outputs and their results do not depend on the thread count.
#pragma once

#include "kernels/registry.h"

// Note [RoPE pairing]: for head dim D (even) and half = D/2, dim i < half pairs with i + half
// and turns by the angle a = positions[t] · theta^(−2i/D) (computed in double):
//     y_i        = x_i cos a − x_{i+half} sin a
//     y_{i+half} = x_{i+half} cos a + x_i sin a
// positions holds global token indices, so a context-parallel rank passes its own (possibly
// non-contiguous) slice of them.

// x (B, T, H, D), y (B, T, H, D): contiguous, same float dtype, D even.
// positions (T): contiguous integer tensor (i32, i64, u16 or u32).
LOOM_DECLARE_KERNEL(rope_forward, void(const loom::Tensor& x, const loom::Tensor& positions,
                                       double theta, loom::Tensor& y));
// dx += dy turned by the negative angle (the transpose of the rotation).
// dy (B, T, H, D), dx (B, T, H, D): contiguous, same float dtype; positions as above.
LOOM_DECLARE_KERNEL(rope_backward, void(const loom::Tensor& dy, const loom::Tensor& positions,
                                        double theta, loom::Tensor& dx));
