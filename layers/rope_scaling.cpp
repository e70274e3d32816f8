// layers/rope_scaling.cpp — the scaled RoPE frequencies of layers/rope_scaling.h (Note [RoPE
// scaling]).
#include "layers/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace loom {
namespace {

double yarn_mscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

}  // namespace

void validate_rope_scaling(const ModelConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  LOOM_CONFIG_CHECK(
      r.type == "none" || r.type == "linear" || r.type == "llama3" || r.type == "yarn",
      "model.rope_scaling.type: '", r.type,
      "' is not one Loom computes (none, linear, llama3 or yarn)");
  if (r.type == "none") return;
  LOOM_CONFIG_CHECK(c.is_llama(), "model.rope_scaling: only a llama model has RoPE");
  LOOM_CONFIG_CHECK(r.factor > 0 || (r.type == "yarn" && r.factor == 0),
                    "model.rope_scaling.factor: must be positive, got ", r.factor);
  if (r.type == "llama3") {
    LOOM_CONFIG_CHECK(r.original_max_seq_len > 0,
                      "model.rope_scaling.original_max_seq_len: llama3 needs the pre-training "
                      "context length");
    LOOM_CONFIG_CHECK(
        r.high_freq_factor > r.low_freq_factor && r.low_freq_factor > 0,
        "model.rope_scaling: llama3 needs 0 < low_freq_factor < high_freq_factor, got ",
        r.low_freq_factor, " and ", r.high_freq_factor);
  }
  if (r.type == "yarn") {
    LOOM_CONFIG_CHECK(r.beta_fast > 0 && r.beta_slow > 0,
                      "model.rope_scaling: yarn needs positive beta_fast and beta_slow");
    LOOM_CONFIG_CHECK(r.original_max_seq_len >= 0,
                      "model.rope_scaling.original_max_seq_len: must not be negative");
  }
}

kernels::RopeFrequencies rope_frequencies(const ModelConfig& c) {
  const int64_t d = c.head_dim();
  kernels::RopeFrequencies f = kernels::RopeFrequencies::plain(c.rope_theta, d);
  const RopeScaling& r = c.rope_scaling;
  const double pi = std::numbers::pi;
  if (r.type == "linear") {
    for (double& x : f.inv_freq) x /= r.factor;
  } else if (r.type == "llama3") {
    const double L = static_cast<double>(r.original_max_seq_len);
    const double low_wavelen = L / r.low_freq_factor, high_wavelen = L / r.high_freq_factor;
    for (double& x : f.inv_freq) {
      const double w = 2 * pi / x;
      if (w > low_wavelen) {
        x /= r.factor;
      } else if (w >= high_wavelen) {
        const double smooth =
            (L / w - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        x = (1 - smooth) * x / r.factor + smooth * x;
      }
    }
  } else if (r.type == "yarn") {
    const double L =
        static_cast<double>(r.original_max_seq_len > 0 ? r.original_max_seq_len : c.max_seq_len);
    // transformers: factor unset → max_position_embeddings / original_max_position_embeddings.
    const double factor = r.factor > 0 ? r.factor : static_cast<double>(c.max_seq_len) / L;
    const double dim = static_cast<double>(d), base = c.rope_theta;
    // The dim whose frequency turns `rotations` times over the pre-training context.
    const auto correction_dim = [&](double rotations) {
      return dim * std::log(L / (rotations * 2 * pi)) / (2 * std::log(base));
    };
    double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;
    for (size_t i = 0; i < f.inv_freq.size(); ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1 - ramp;  // the weight of the unscaled frequency
      f.inv_freq[i] = f.inv_freq[i] / factor * (1 - extrapolation) + f.inv_freq[i] * extrapolation;
    }
    f.scale = r.attention_factor > 0 ? r.attention_factor
              : r.mscale > 0 && r.mscale_all_dim > 0
                  ? yarn_mscale(factor, r.mscale) / yarn_mscale(factor, r.mscale_all_dim)
                  : yarn_mscale(factor, 1);
  }
  return f;
}

}  // namespace loom
