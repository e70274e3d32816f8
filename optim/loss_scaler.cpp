// optim/loss_scaler.cpp — dynamic loss scaling (see optim/loss_scaler.h).
#include "optim/loss_scaler.h"

#include <cmath>

#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "kernels/reduce.h"

namespace loom::optim {
namespace {

bool is_power_of_two(double x) {
  int exponent = 0;
  return x > 0 && std::frexp(x, &exponent) == 0.5;
}

}  // namespace

LossScaler::LossScaler(double init_scale, int64_t growth_interval)
    : growth_interval_(growth_interval) {
  LOOM_CHECK(std::isfinite(init_scale) && init_scale >= kMinScale,
             "LossScaler: init_scale must be finite and >= ", kMinScale, ", got ", init_scale);
  LOOM_CHECK(growth_interval > 0, "LossScaler: growth_interval must be positive, got ",
             growth_interval);
  int exponent = 0;
  std::frexp(init_scale, &exponent);
  state_.scale = std::ldexp(1.0, exponent - 1);  // the power of two at or below init_scale
}

Tensor LossScaler::scale_loss(const Tensor& loss) const {
  if (!device_state_.defined()) return ops::scale(loss, state_.scale);
  // × the device's scale: the same product (a power of two) as ops::scale with it.
  return ops::mul(loss, ops::to_dtype(device_scale(), loss.dtype()));
}

Tensor LossScaler::device_scale() const {
  LOOM_CHECK(device_state_.defined(), "LossScaler::device_scale: call to(device) first");
  return ops::reshape(ops::narrow(device_state_, 0, 0, 1), {});
}

bool LossScaler::update(double norm) {
  double good = static_cast<double>(state_.good_steps),
         skipped = static_cast<double>(state_.skipped_steps);
  const bool take = kernels::loss_scale_update(norm, static_cast<double>(growth_interval_),
                                               state_.scale, good, skipped);
  state_.good_steps = static_cast<int64_t>(good);
  state_.skipped_steps = static_cast<int64_t>(skipped);
  return take;
}

void LossScaler::to(Device device) {
  device_state_ =
      Tensor::from_vector(std::vector<double>{state_.scale, static_cast<double>(state_.good_steps),
                                              static_cast<double>(state_.skipped_steps)},
                          {3})
          .to(device);
}

Tensor LossScaler::step_factor(const Tensor& sq_sum, double max_norm) {
  LOOM_CHECK(device_state_.defined(), "LossScaler::step_factor: call to(device) first");
  Tensor factor = Tensor::empty({}, DType::kF64, device_state_.device());
  kernels::call_kernel<kernels::loss_scale_step_k>(
      ops::reshape(sq_sum, {}).contiguous(), device_state_, max_norm, growth_interval_, factor);
  return factor;
}

void LossScaler::mirror(const std::vector<double>& v) {
  LOOM_CHECK(v.size() == 3, "LossScaler::mirror: a state has 3 values, got ", v.size());
  state_ = {v[0], static_cast<int64_t>(v[1]), static_cast<int64_t>(v[2])};
}

void LossScaler::set_state(const LossScalerState& s) {
  LOOM_CHECK(is_power_of_two(s.scale) && s.scale >= kMinScale && std::isfinite(s.scale),
             "LossScaler: saved scale ", s.scale, " is not a power of two >= ", kMinScale);
  LOOM_CHECK(s.good_steps >= 0 && s.skipped_steps >= 0, "LossScaler: negative saved step counts");
  state_ = s;
  if (device_state_.defined()) to(device_state_.device());
}

}  // namespace loom::optim
