// train/noise_scale.cpp — the gradient noise scale (see train/noise_scale.h).
#include "train/noise_scale.h"

#include "core/error.h"

namespace loom {

void NoiseScale::add(double small_sq, double big_sq, double b_small, double b_big) {
  LOOM_CHECK(b_small > 0 && b_big > b_small, "NoiseScale: batches ", b_small, " and ", b_big,
             " must satisfy 0 < small < big");
  const double g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small);
  const double s = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big);
  if (steps_ == 0) {
    g2_ = g2;
    s_ = s;
  } else {
    g2_ = beta_ * g2_ + (1 - beta_) * g2;
    s_ = beta_ * s_ + (1 - beta_) * s;
  }
  ++steps_;
}

std::optional<double> NoiseScale::tokens() const {
  if (steps_ == 0 || g2_ <= 0) return std::nullopt;
  return s_ / g2_;
}

}  // namespace loom
