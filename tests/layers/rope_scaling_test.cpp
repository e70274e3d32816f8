// tests/layers/rope_scaling_test.cpp — a model's RoPE frequencies (Note [RoPE scaling] in
// layers/rope_scaling.h): each scaled variant's defining properties at its boundaries, the
// config keys it refuses, and a model whose heads are not n_embd / n_head wide. Values against
// transformers' own models: tools/check_hf_roundtrip.py (needs torch; logits within 3e-7).
#include "layers/rope_scaling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/rng.h"
#include "layers/transformer.h"

namespace loom {
namespace {

ModelConfig llama(const RopeScaling& r) {
  ModelConfig c;
  c.arch = "llama";
  c.n_embd = 64;
  c.n_head = 2;  // head dim 32: 16 frequencies
  c.max_seq_len = 64;
  c.rope_scaling = r;
  return c;
}

std::string config_error(const ModelConfig& c) {
  try {
    validate(c);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(RopeScaling, NoneIsThePlainRope) {
  const kernels::RopeFrequencies f = rope_frequencies(llama({}));
  ASSERT_EQ(f.inv_freq.size(), 16U);
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(f.inv_freq[i], std::pow(10000.0, -2.0 * i / 32));
  EXPECT_EQ(f.scale, 1.0);
}

TEST(RopeScaling, LinearDividesEveryFrequency) {
  const auto plain = rope_frequencies(llama({})).inv_freq;
  const auto f = rope_frequencies(llama({.type = "linear", .factor = 4}));
  for (size_t i = 0; i < 16; ++i) EXPECT_DOUBLE_EQ(f.inv_freq[i], plain[i] / 4);
  EXPECT_EQ(f.scale, 1.0);
}

// Wavelengths below L/high_freq_factor are kept, above L/low_freq_factor divided by factor, and
// in between interpolated strictly between the two.
TEST(RopeScaling, Llama3KeepsShortWavelengthsAndDividesLongOnes) {
  const RopeScaling r{.type = "llama3",
                      .factor = 8,
                      .low_freq_factor = 1,
                      .high_freq_factor = 4,
                      .original_max_seq_len = 256};
  const auto plain = rope_frequencies(llama({})).inv_freq;
  const auto f = rope_frequencies(llama(r)).inv_freq;
  int kept = 0, divided = 0, between = 0;
  for (size_t i = 0; i < 16; ++i) {
    const double w = 2 * std::numbers::pi / plain[i];
    if (w < 256.0 / 4) {
      EXPECT_EQ(f[i], plain[i]) << i;
      ++kept;
    } else if (w > 256.0) {
      EXPECT_DOUBLE_EQ(f[i], plain[i] / 8) << i;
      ++divided;
    } else {
      EXPECT_LT(f[i], plain[i]) << i;
      EXPECT_GT(f[i], plain[i] / 8) << i;
      ++between;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(between, 0);
}

// YaRN: the dims below the correction range keep their frequency, those above are divided by
// factor, and the cos/sin carry 0.1·ln(factor) + 1 — or attention_factor when given, or the
// ratio of the two mscales.
TEST(RopeScaling, YarnRampsBetweenKeptAndInterpolatedDims) {
  const auto plain = rope_frequencies(llama({})).inv_freq;
  const auto f = rope_frequencies(llama({.type = "yarn", .factor = 4, .original_max_seq_len = 64}));
  EXPECT_EQ(f.inv_freq.front(), plain.front());
  EXPECT_DOUBLE_EQ(f.inv_freq.back(), plain.back() / 4);
  for (size_t i = 1; i < 16; ++i)
    EXPECT_LE(f.inv_freq[i] / plain[i], f.inv_freq[i - 1] / plain[i - 1]);
  EXPECT_DOUBLE_EQ(f.scale, 0.1 * std::log(4.0) + 1);
  EXPECT_EQ(rope_frequencies(llama({.type = "yarn", .factor = 4, .attention_factor = 1.5})).scale,
            1.5);
  const double ratio = (0.1 * 0.7 * std::log(4.0) + 1) / (0.1 * 0.5 * std::log(4.0) + 1);
  EXPECT_DOUBLE_EQ(
      rope_frequencies(llama({.type = "yarn", .factor = 4, .mscale = 0.7, .mscale_all_dim = 0.5}))
          .scale,
      ratio);
  // factor unset: max_seq_len / original_max_seq_len (64 / 16).
  EXPECT_EQ(
      rope_frequencies(llama({.type = "yarn", .factor = 0, .original_max_seq_len = 16})).inv_freq,
      rope_frequencies(llama({.type = "yarn", .factor = 4, .original_max_seq_len = 16})).inv_freq);
}

TEST(RopeScaling, BadValuesNameTheKey) {
  EXPECT_NE(config_error(llama({.type = "dynamic"})).find("model.rope_scaling.type: 'dynamic'"),
            std::string::npos);
  EXPECT_NE(config_error(llama({.type = "linear", .factor = -1})).find("model.rope_scaling.factor"),
            std::string::npos);
  EXPECT_NE(config_error(llama({.type = "llama3", .factor = 8}))
                .find("model.rope_scaling.original_max_seq_len"),
            std::string::npos);
  ModelConfig gpt2 = llama({.type = "linear", .factor = 2});
  gpt2.arch = "gpt2";
  EXPECT_NE(config_error(gpt2).find("model.rope_scaling"), std::string::npos);
  EXPECT_EQ(config_error(llama({.type = "yarn", .factor = 2})), "");
}

// head_dim set apart from n_embd / n_head (Qwen3's and Mistral's shapes): q is n_head·head_dim
// wide, the projection maps it back to n_embd, and the parameter count follows.
TEST(RopeScaling, ExplicitHeadDimShapesTheAttention) {
  ModelConfig c = llama({});
  c.vocab_size = 64;
  c.n_layer = 1;
  c.n_kv_head = 1;
  c.explicit_head_dim = 24;
  c.attention_bias = c.mlp_bias = true;
  Transformer m(c);
  int64_t n = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    n += p.numel();
    if (name == "blocks.0.attn.qkv.weight") {
      EXPECT_EQ(p.size(0), (2 + 2) * 24);
      EXPECT_EQ(p.size(1), 64);
    }
    if (name == "blocks.0.attn.proj.weight") {
      EXPECT_EQ(p.size(1), 2 * 24);
    }
  }
  EXPECT_EQ(n, count_parameters(c));
  Generator gen(3);
  m.init_weights(gen);
  const Tensor logits = m.forward(Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {1, 4}));
  EXPECT_EQ(logits.size(2), c.padded_vocab());
}

}  // namespace
}  // namespace loom
