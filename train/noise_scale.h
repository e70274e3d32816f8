// train/noise_scale.h — the gradient noise scale during training (McCandlish, Kaplan, Amodei et
// al. 2018, "An Empirical Model of Large-Batch Training", arXiv 1812.06162, appendix A).
//
// Note [Gradient noise scale]: with |G_s|² the squared norm of a gradient over B_s tokens and
// |G_b|² that over B_b tokens (same weights), the unbiased estimates of the true gradient's
// squared norm and of the per-token noise tr(Σ) are
//     |G|² ≈ (B_b·|G_b|² − B_s·|G_s|²) / (B_b − B_s),   S ≈ (|G_s|² − |G_b|²) / (1/B_s − 1/B_b),
// and B_noise = S / |G|² (tokens) estimates the critical batch, the batch beyond which doubling
// it no longer halves the steps. Both estimates are noisy: each is averaged with an exponential
// moving average (β = 0.9) before the ratio, as the paper does. In Loom (train.noise_scale):
// G_s is this rank's first accumulation micro-batch's gradient of its mean loss (B_s = its
// tokens) — read from the gradient buffers before the next micro-batch adds to them
// (GradientEngine::local_grad_sum_squares: one process, DDP and ZeRO-1) — or, without
// accumulation under DDP / ZeRO-1, this rank's gradient of its micro-batch, summed bucket by
// bucket as the engine hands each to its all-reduce (GradientEngine::probe_unreduced_grads;
// early contributions of a tied table are declined then, so it reaches its bucket whole) — and
// G_b the step's gradient, averaged over every rank and micro-batch (B_b = the step's tokens),
// whose norm the step reports anyway. Needs optim.grad_accum ≥ 2 or parallel.dp ≥ 2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "train/config.h"

namespace loom {

class NoiseScale {
 public:
  explicit NoiseScale(double beta = 0.9) : beta_(beta) {}
  // One step's norms (squared) over b_small and b_big tokens (b_small < b_big).
  void add(double small_sq, double big_sq, double b_small, double b_big);
  // S / |G|² of the averages, in tokens; none before a step, or while |G|²'s average is ≤ 0.
  std::optional<double> tokens() const;
  double noise() const { return s_; }    // the averaged S
  double signal() const { return g2_; }  // the averaged |G|²

 private:
  double beta_;
  double s_ = 0, g2_ = 0;
  int64_t steps_ = 0;
};

// What a noise scale of `tokens` says of the config's batch (`train --plan --noise-scale N`): the
// critical batch in tokens and sequences, the config's global batch against it, and the
// data-parallel degree that reaches it with the config's micro-batch and accumulation.
std::string format_critical_batch(const Config& config, double tokens);

}  // namespace loom
