// layers/rope_scaling.h — a model's RoPE frequencies (Note [RoPE pairing] in kernels/rope.h):
// the plain ones of base rope_theta, or one of the scaled variants Hugging Face checkpoints name
// in config.json's rope_scaling / rope_parameters (model.rope_scaling in a Loom config).
//
// Note [RoPE scaling]: computed as transformers' modeling_rope_utils does (its inverse
// frequencies, then cos/sin times its attention factor), in double where it uses float32:
// - linear: every f_i divided by factor.
// - llama3 (Llama 3.1–3.3): with wavelength w_i = 2π/f_i and the pre-training context L =
//   original_max_seq_len, f_i is kept where w_i < L/high_freq_factor, divided by factor where
//   w_i > L/low_freq_factor, and in between interpolated with the weight
//   (L/w_i − low_freq_factor) / (high_freq_factor − low_freq_factor) on the kept value.
// - yarn: a ramp over the dims between the correction dims of beta_fast and beta_slow rotations
//   (floored and ceiled when truncate) mixes f_i (extrapolated) and f_i/factor (interpolated);
//   the cos/sin are scaled by attention_factor, else 0.1·ln(factor) + 1 (or the ratio of that
//   with mscale to that with mscale_all_dim when both are set).
// A type Loom does not compute (dynamic NTK, longrope, …) is refused where the config is read.
#pragma once

#include "kernels/rope.h"
#include "layers/model_config.h"

namespace loom {

// The D/2 frequencies and scale of the model's RoPE (D = head_dim()).
kernels::RopeFrequencies rope_frequencies(const ModelConfig& c);

// Throws ConfigError naming model.rope_scaling's key for a type or value it cannot use.
void validate_rope_scaling(const ModelConfig& c);

}  // namespace loom
