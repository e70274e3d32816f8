// kernels/reduce.h — sum over one dimension, the sum of squares, and what a step derives from
// the gradients' sum of squares where it lies: the gradient-clipping factor, and under dynamic
// loss scaling the unscale-and-clip factor with the loss scale's update.
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

// Note [Loss scale rule]: dynamic loss scaling ends a step from the norm of the gradients it
// unscaled. A finite norm counts a good step and, once `growth_interval` are in a row, doubles
// the scale (unless that overflows) and restarts the count; a non-finite norm (an overflow)
// halves the scale, never below 1, restarts the count and counts a skipped step. Returns whether
// the optimizer step is taken. The one definition: optim::LossScaler::update on the host,
// loss_scale_step on every device. Counts are held in doubles (exact below 2^53).
LOOM_HD bool loss_scale_update(double norm, double growth_interval, double& scale,
                               double& good_steps, double& skipped_steps) {
  if (!(norm < std::numeric_limits<double>::infinity())) {  // inf or NaN
    scale = scale * 0.5 < 1.0 ? 1.0 : scale * 0.5;
    good_steps = 0;
    skipped_steps += 1;
    return false;
  }
  good_steps += 1;
  if (good_steps >= growth_interval) {
    if (scale * 2.0 < std::numeric_limits<double>::infinity()) scale *= 2.0;
    good_steps = 0;
  }
  return true;
}

}  // namespace loom::kernels

// out (0-d f64) = clip_factor(sqrt(sq_sum), max_norm) for sq_sum (0-d f64, the gradients' global
// sum of squares), on sq_sum's device: clipping without reading the norm back (Note [Device
// step] in train/train_step.cpp). max_norm > 0.
LOOM_DECLARE_KERNEL(clip_factor_forward,
                    void(const loom::Tensor& sq_sum, double max_norm, loom::Tensor& out));

// One step of dynamic loss scaling where the numbers lie (Note [Device step] in
// train/train_step.cpp). sq_sum (0-d f64): Σ g² of the *scaled* gradients, every rank's parts
// summed; state (f64 [3], contiguous): {scale, good_steps, skipped_steps}, updated in place by
// Note [Loss scale rule] applied to sqrt(sq_sum) / scale; factor (0-d f64) receives what the
// optimizer multiplies the gradients by: clip_factor(sqrt(sq_sum) / scale, max_norm) / scale
// (max_norm <= 0: no clipping, 1 / scale) when the norm is finite, else NaN — which skips the
// update (optim::Optimizer::step_scaled). The scale is a power of two, so unscaling is exact.
LOOM_DECLARE_KERNEL(loss_scale_step,
                    void(const loom::Tensor& sq_sum, loom::Tensor& state, double max_norm,
                         int64_t growth_interval, loom::Tensor& factor));

namespace loom::kernels {

inline void check_loss_scale_step_args(const Tensor& sq_sum, const Tensor& state,
                                       int64_t growth_interval, const Tensor& factor) {
  LOOM_CHECK(
      sq_sum.numel() == 1 && sq_sum.dtype() == DType::kF64 && factor.numel() == 1 &&
          factor.dtype() == DType::kF64 && state.numel() == 3 && state.dtype() == DType::kF64 &&
          state.is_contiguous() && sq_sum.device() == state.device() &&
          factor.device() == state.device(),
      "loss_scale_step: sq_sum and factor must be one f64 element and state three contiguous f64 "
      "elements, on one device");
  LOOM_CHECK(growth_interval > 0, "loss_scale_step: growth_interval must be positive, got ",
             growth_interval);
}

// loss_scale_step's arithmetic, the kernels' shared body: scaled_norm = sqrt(sq_sum) (each
// kernel's correctly rounded square root), state as the kernel's; returns the factor.
LOOM_HD double loss_scale_step_values(double scaled_norm, double max_norm, double growth_interval,
                                      double* state) {
  const double scale = state[0];
  const double norm = scaled_norm / scale;  // exact: scale is a power of two
  const bool take = loss_scale_update(norm, growth_interval, state[0], state[1], state[2]);
  if (!take) return std::numeric_limits<double>::quiet_NaN();
  return (max_norm > 0 ? clip_factor(norm, max_norm) : 1.0) / scale;
}

}  // namespace loom::kernels
