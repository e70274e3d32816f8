// optim/loss_scaler.cpp — dynamic loss scaling (see optim/loss_scaler.h).
#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "core/ops/elementwise.h"
#include "optim/clip.h"

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

Tensor LossScaler::scale_loss(const Tensor& loss) const { return ops::scale(loss, state_.scale); }

double LossScaler::unscale_(const std::vector<Tensor>& grads, double scaled_norm) const {
  if (!std::isfinite(scaled_norm)) return scaled_norm;
  scale_grads(grads, 1.0 / state_.scale);
  return scaled_norm / state_.scale;
}

bool LossScaler::update(double norm) {
  if (!std::isfinite(norm)) {
    state_.scale = std::max(kMinScale, state_.scale * 0.5);
    state_.good_steps = 0;
    ++state_.skipped_steps;
    return false;
  }
  if (++state_.good_steps >= growth_interval_) {
    const double grown = state_.scale * 2.0;
    if (std::isfinite(grown)) state_.scale = grown;
    state_.good_steps = 0;
  }
  return true;
}

void LossScaler::set_state(const LossScalerState& s) {
  LOOM_CHECK(is_power_of_two(s.scale) && s.scale >= kMinScale && std::isfinite(s.scale),
             "LossScaler: saved scale ", s.scale, " is not a power of two >= ", kMinScale);
  LOOM_CHECK(s.good_steps >= 0 && s.skipped_steps >= 0, "LossScaler: negative saved step counts");
  state_ = s;
}

}  // namespace loom::optim
