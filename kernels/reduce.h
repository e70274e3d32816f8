// kernels/reduce.h — sum over one dimension, the sum of squares, and the gradient-clipping
// factor computed from such a sum where it lies.
#pragma once

#include <limits>

#include "core/philox.h"  // LOOM_HD
#include "kernels/registry.h"

// x contiguous, read as (outer, n, inner); out contiguous (outer, inner): out = Σ_n x.
// Each output element is summed by one thread in index order: the result does not depend on
// the thread count.
LOOM_DECLARE_KERNEL(sum_dim_forward, void(const loom::Tensor& x, int64_t outer, int64_t n,
                                          int64_t inner, loom::Tensor& out));
// out (0-d f64) = Σ x² over all elements of contiguous x, accumulated in double over fixed-size
// chunks whose partial sums are added in chunk order (thread-count independent).
LOOM_DECLARE_KERNEL(sum_squares_forward, void(const loom::Tensor& x, loom::Tensor& out));

namespace loom::kernels {

// The factor gradient clipping multiplies gradients by: max_norm / norm when the norm exceeds
// max_norm, else 1; a non-finite norm also gives 1 (the gradients are left for the caller to
// inspect or skip). The one definition: optim::clip_scale on the host, clip_factor_forward on
// every device.
LOOM_HD double clip_factor(double norm, double max_norm) {
  return norm > max_norm && norm < std::numeric_limits<double>::infinity() ? max_norm / norm : 1.0;
}

}  // namespace loom::kernels

// out (0-d f64) = clip_factor(sqrt(sq_sum), max_norm) for sq_sum (0-d f64, the gradients' global
// sum of squares), on sq_sum's device: clipping without reading the norm back (Note [Device
// step] in train/trainer.cpp). max_norm > 0.
LOOM_DECLARE_KERNEL(clip_factor_forward,
                    void(const loom::Tensor& sq_sum, double max_norm, loom::Tensor& out));
