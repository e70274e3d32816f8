// optim/loss_scaler.h — dynamic loss scaling for f16 training (DESIGN §6): the loss is multiplied
// by a scale before backward so that small gradients survive f16's narrow range; the gradients
// are divided by it before the optimizer; a step whose gradients overflowed (inf/NaN) is
// skipped and the scale halved; after growth_interval good steps in a row the scale doubles.
// Holds only its own numbers (saved in checkpoints through state()/set_state()); it reads no
// tensor itself: the caller passes the gradients' global norm, read once per step.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace loom::optim {

struct LossScalerState {
  double scale = 65536.0;
  int64_t good_steps = 0;     // finite steps since the last overflow or growth
  int64_t skipped_steps = 0;  // overflowed steps, in total
};

class LossScaler {
 public:
  // Scales are powers of two (init_scale is rounded to one), so scaling and unscaling are exact
  // while no overflow or underflow occurs. The scale never drops below kMinScale.
  static constexpr double kMinScale = 1.0;
  explicit LossScaler(double init_scale = 65536.0, int64_t growth_interval = 2000);

  double scale() const { return state_.scale; }
  int64_t growth_interval() const { return growth_interval_; }

  // loss · scale, differentiable (its backward multiplies the incoming gradient by the scale).
  Tensor scale_loss(const Tensor& loss) const;
  // Given the global norm of the scaled gradients (optim::global_grad_norm): when it is finite,
  // divides every gradient by the scale in place and returns the true gradients' norm; when it
  // is inf/NaN (an overflow), leaves the gradients as they are and returns it unchanged.
  double unscale_(const std::vector<Tensor>& grads, double scaled_norm) const;
  // Ends a step: a finite norm counts a good step (doubling the scale once growth_interval are in
  // a row) and returns true (run the optimizer); a non-finite one halves the scale, resets the
  // count, counts a skipped step and returns false (skip the optimizer step).
  bool update(double norm);

  LossScalerState state() const { return state_; }
  void set_state(const LossScalerState& s);

 private:
  LossScalerState state_;
  int64_t growth_interval_;
};

}  // namespace loom::optim
