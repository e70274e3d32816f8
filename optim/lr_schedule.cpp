// optim/lr_schedule.cpp — validation and evaluation of LrSchedule (Note [Learning-rate
// schedule] in the header).
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace loom::optim {
namespace {

constexpr const char* kWhere = "optim.lr_schedule";

int64_t wsd_decay_steps(const LrSchedule& s) {
  return static_cast<int64_t>(std::llround(s.decay_fraction * static_cast<double>(s.total_steps)));
}

// Fraction of the post-warmup phase elapsed at `step`, in [0, 1].
double post_warmup_progress(const LrSchedule& s, int64_t step) {
  const int64_t span = s.total_steps - s.warmup_steps;
  if (span <= 0) return 1.0;
  const double p = static_cast<double>(step - s.warmup_steps) / static_cast<double>(span);
  return std::clamp(p, 0.0, 1.0);
}

double wsd_lr(const LrSchedule& s, int64_t step) {
  const int64_t d = wsd_decay_steps(s);
  const int64_t start = s.total_steps - d;
  if (step < start) return s.max_lr;
  if (d == 0) return s.min_lr;
  const double p = std::min(1.0, static_cast<double>(step - start) / static_cast<double>(d));
  return s.max_lr + (s.min_lr - s.max_lr) * p;
}

}  // namespace

void LrSchedule::validate() const {
  const bool known = kind == "cosine" || kind == "linear" || kind == "constant" || kind == "wsd";
  LOOM_CHECK(known, kWhere, ": unknown kind '", kind, "' (cosine, linear, constant, wsd)");
  LOOM_CHECK(std::isfinite(max_lr) && max_lr >= 0, kWhere, ": max_lr must be finite and >= 0, got ",
             max_lr);
  LOOM_CHECK(warmup_steps >= 0, kWhere, ": warmup_steps must be >= 0, got ", warmup_steps);
  if (kind == "constant") return;
  LOOM_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= max_lr, kWhere,
             ": min_lr must be in [0, max_lr = ", max_lr, "], got ", min_lr);
  LOOM_CHECK(total_steps > 0, kWhere, ": total_steps must be > 0 for kind '", kind, "', got ",
             total_steps);
  LOOM_CHECK(warmup_steps <= total_steps, kWhere, ": warmup_steps (", warmup_steps,
             ") exceeds total_steps (", total_steps, ")");
  if (kind != "wsd") return;
  LOOM_CHECK(decay_fraction >= 0 && decay_fraction <= 1, kWhere,
             ": decay_fraction must be in [0, 1], got ", decay_fraction);
  LOOM_CHECK(total_steps - wsd_decay_steps(*this) >= warmup_steps, kWhere, ": wsd decay phase (",
             wsd_decay_steps(*this), " steps = decay_fraction ", decay_fraction, " of total_steps ",
             total_steps, ") overlaps warmup_steps (", warmup_steps, ")");
}

double LrSchedule::lr_at(int64_t step) const {
  validate();
  LOOM_CHECK(step >= 0, kWhere, ": step must be >= 0, got ", step);
  if (step < warmup_steps) {
    return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (kind == "constant") return max_lr;
  if (kind == "wsd") return wsd_lr(*this, step);
  const double p = post_warmup_progress(*this, step);
  if (kind == "linear") return max_lr + (min_lr - max_lr) * p;
  return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

}  // namespace loom::optim
