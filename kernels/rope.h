// kernels/rope.h — rotary position embedding kernels (rotate-half pairing, as in GPT-NeoX and
// Hugging Face Llama). Kernels only read and write the buffers they are given; they allocate
// no outputs and their results do not depend on the thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/registry.h"

// Note [RoPE pairing]: for head dim D (even) and half = D/2, dim i < half pairs with i + half
// and turns by the angle a = positions[t] · f_i (computed in double), scaled by s:
//     y_i        = s · (x_i cos a − x_{i+half} sin a)
//     y_{i+half} = s · (x_{i+half} cos a + x_i sin a)
// f_i = theta^(−2i/D) for the plain RoPE; a model's scaled RoPE (Llama 3's, linear, YaRN) has
// its own f_i and s (layers/rope_scaling.h). positions holds global token indices, so a
// context-parallel rank passes its own (possibly non-contiguous) slice of them.
namespace loom::kernels {

struct RopeFrequencies {
  std::vector<double> inv_freq;  // f_i, i < D/2
  double scale = 1;              // s: multiplies cos and sin (YaRN's attention factor)

  // The plain RoPE of head dim d: f_i = theta^(−2i/d), s = 1.
  static RopeFrequencies plain(double theta, int64_t d) {
    RopeFrequencies f;
    for (int64_t i = 0; i < d / 2; ++i)
      f.inv_freq.push_back(std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d)));
    return f;
  }
};

}  // namespace loom::kernels

// x (B, T, H, D), y (B, T, H, D): contiguous, same float dtype, D even; f has D/2 frequencies.
// positions (T): contiguous integer tensor (i32, i64, u16 or u32).
LOOM_DECLARE_KERNEL(rope_forward, void(const loom::Tensor& x, const loom::Tensor& positions,
                                       const loom::kernels::RopeFrequencies& f, loom::Tensor& y));
// dx += dy turned by the negative angle (the transpose of the rotation), scaled by s.
// dy (B, T, H, D), dx (B, T, H, D): contiguous, same float dtype; positions and f as above.
LOOM_DECLARE_KERNEL(rope_backward, void(const loom::Tensor& dy, const loom::Tensor& positions,
                                        const loom::kernels::RopeFrequencies& f, loom::Tensor& dx));
