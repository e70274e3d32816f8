// optim/lr_schedule.h — learning-rate schedules: linear warmup, then cosine, linear, constant
// or warmup-stable-decay (WSD). A plain value type: lr_at(step) is a pure function of the
// fields, so a resumed run gets the same rates from the step number alone.
#pragma once

#include <cstdint>
#include <string>

namespace loom::optim {

// Note [Learning-rate schedule]: steps count from 0 (the first optimiser step is step 0).
//   warmup:   step < warmup_steps          lr = max_lr · (step + 1) / warmup_steps
//             (step 0 gives max_lr / warmup_steps; step warmup_steps - 1 gives max_lr).
//   then, with p = (step - warmup_steps) / (total_steps - warmup_steps) clamped to [0, 1]
//   (p = 1 when total_steps == warmup_steps):
//     cosine:   lr = min_lr + (max_lr - min_lr) · (1 + cos(π p)) / 2
//     linear:   lr = max_lr + (min_lr - max_lr) · p
//     constant: lr = max_lr                               (min_lr and total_steps unused)
//     wsd:      D = round(decay_fraction · total_steps) decay steps, starting at
//               S = total_steps - D (S >= warmup_steps is required):
//               step < S: lr = max_lr;
//               else      lr = max_lr + (min_lr - max_lr) · min(1, (step - S) / D)
//   Every non-constant kind reaches min_lr exactly at step total_steps and stays there.
struct LrSchedule {
  std::string kind = "cosine";  // "cosine" | "linear" | "constant" | "wsd"
  double max_lr = 0.0;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double decay_fraction = 0.2;  // wsd only: fraction of total_steps spent in the final decay

  // Throws loom::Error naming the field when the fields are inconsistent, e.g.
  // "optim.lr_schedule: unknown kind 'cosin' (cosine, linear, constant, wsd)".
  void validate() const;
  // The learning rate for optimiser step `step` (>= 0). Validates first.
  double lr_at(int64_t step) const;
};

}  // namespace loom::optim
