// train/noise_scale.cpp — the gradient noise scale (see train/noise_scale.h).
#include "train/noise_scale.h"

#include <cmath>
#include <iomanip>
#include <sstream>

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

std::string format_critical_batch(const Config& c, double tokens) {
  const double per_replica =
      static_cast<double>(c.data.batch_size * c.data.seq_len * c.optim.grad_accum);
  const double now = per_replica * static_cast<double>(c.parallel.dp);
  std::ostringstream o;
  o << std::fixed << std::setprecision(0) << "critical batch ≈ " << tokens
    << " tokens (the noise scale; McCandlish et al. 2018): "
    << tokens / static_cast<double>(c.data.seq_len) << " sequences; this config's global batch is "
    << now << " tokens, " << std::setprecision(2) << now / tokens
    << "× it; data.batch_size × optim.grad_accum × dp reaches it at dp " << std::setprecision(0)
    << std::ceil(tokens / per_replica) << "\n";
  return o.str();
}

}  // namespace loom
