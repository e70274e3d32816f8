// optim/loss_scaler.h — dynamic loss scaling for f16 training (DESIGN §6): the loss is multiplied
// by a scale before backward so that small gradients survive f16's narrow range; the gradients
// are divided by it before the optimizer; a step whose gradients overflowed (inf/NaN) is
// skipped and the scale halved; after growth_interval good steps in a row the scale doubles
// (Note [Loss scale rule] in kernels/reduce.h). Holds its numbers on the host (saved in
// checkpoints through state()/set_state()); once to(device) is called, the numbers that count
// live on that device and each step is decided there without a host read (step_factor; Note
// [Device step] in train/train_step.cpp), the host copy being refreshed by the caller (mirror)
// from what it reads back.
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

  // loss · scale, differentiable (its backward multiplies the incoming gradient by the scale);
  // after to(device), the scale is the device's (loss on that device).
  Tensor scale_loss(const Tensor& loss) const;
  // Ends a step on the host: a finite norm counts a good step (doubling the scale once
  // growth_interval are in a row) and returns true (run the optimizer); a non-finite one halves
  // the scale, resets the count, counts a skipped step and returns false (skip the step).
  bool update(double norm);

  // The device half. to(device) copies the state there (f64 [3]: scale, good_steps,
  // skipped_steps). step_factor then ends a step there from the scaled gradients' Σ g² (0-d
  // f64, every rank's parts summed): it returns the factor for optim::Optimizer::step_scaled
  // (unscale and clip at max_norm, max_norm <= 0 for none; NaN after an overflow, which skips the
  // step) and updates the device state (kernels/reduce.h loss_scale_step). The host copy is not
  // touched: the caller reads device_state() back with the step's numbers and passes it to
  // mirror() when it reports the step.
  void to(Device device);
  Tensor step_factor(const Tensor& sq_sum, double max_norm);
  const Tensor& device_state() const { return device_state_; }  // undefined before to()
  Tensor device_scale() const;  // 0-d f64, a view of device_state()'s scale
  void mirror(const std::vector<double>& device_state_values);  // the 3 values, as read back

  LossScalerState state() const { return state_; }
  void set_state(const LossScalerState& s);  // the device copy too, after to()

 private:
  LossScalerState state_;
  int64_t growth_interval_;
  Tensor device_state_;
};

}  // namespace loom::optim
