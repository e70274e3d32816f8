// tests/parallel/diloco/outer_optimizer_test.cpp — DiLoCo's outer SGD (parallel/diloco/
// outer_optimizer.h) against a reference in double over several steps (momentum, Nesterov, none),
// the rounding of stored values once per step, plain averaging at lr 1 and momentum 0, checks.
#include "parallel/diloco/outer_optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"

namespace loom::parallel::diloco {
namespace {

std::vector<float> normal(std::mt19937& rng, int64_t n, float sd) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// torch.optim.SGD (dampening 0) in double throughout: weights and buffer never rounded to f32.
struct RefOuter {
  double lr, mu;
  bool nesterov;
  std::vector<double> w, buf;
  void step(const std::vector<float>& g) {
    for (size_t i = 0; i < w.size(); ++i) {
      double d = g[i];
      if (mu > 0) {
        buf[i] = mu * buf[i] + g[i];
        d = nesterov ? g[i] + mu * buf[i] : buf[i];
      }
      w[i] -= lr * d;
    }
  }
};

void run_against_reference(OuterOptions o) {
  std::mt19937 rng(11);
  const int64_t n = 1001;
  OuterOptimizer opt(o, n);
  opt.weights() = normal(rng, n, 1.0f);
  EXPECT_EQ(opt.momentum().size(), o.momentum > 0 ? size_t(n) : 0u);
  RefOuter ref{o.lr, o.momentum, o.nesterov, {}, std::vector<double>(n, 0.0)};
  ref.w.assign(opt.weights().begin(), opt.weights().end());
  for (int t = 0; t < 8; ++t) {
    const std::vector<float> g = normal(rng, n, 0.1f);
    opt.step(g.data());
    ref.step(g);
    EXPECT_EQ(opt.steps(), t + 1);
    for (int64_t i = 0; i < n; ++i) {
      // f32 storage: at most one rounding (2^-24 relative) per stored value per step
      ASSERT_NEAR(opt.weights()[i], ref.w[i], 1e-6 * (1 + std::fabs(ref.w[i])))
          << "step " << t << " element " << i;
      if (o.momentum > 0) {
        ASSERT_NEAR(opt.momentum()[i], ref.buf[i], 1e-6 * (1 + std::fabs(ref.buf[i])));
      }
    }
  }
}

TEST(DilocoOuter, NesterovMatchesReference) { run_against_reference({0.7, 0.9, true}); }
TEST(DilocoOuter, MomentumMatchesReference) { run_against_reference({0.5, 0.8, false}); }
TEST(DilocoOuter, PlainSgdMatchesReference) { run_against_reference({0.3, 0.0, false}); }
TEST(DilocoOuter, NesterovWithoutMomentumIsPlainSgd) { run_against_reference({0.3, 0.0, true}); }

// Each stored value is the double result (explicit FMAs) rounded once: bit-identical to a loop
// that keeps f32 storage and does every element's arithmetic so (f32 arithmetic would differ).
TEST(DilocoOuter, RoundsStoredValuesOnce) {
  std::mt19937 rng(5);
  const int64_t n = 4096;
  const double lr = 0.7, mu = 0.9;
  OuterOptimizer opt({lr, mu, true}, n);
  opt.weights() = normal(rng, n, 1.0f);
  std::vector<float> w = opt.weights(), buf(n, 0.0f);
  for (int t = 0; t < 5; ++t) {
    const std::vector<float> g = normal(rng, n, 0.1f);
    for (int64_t i = 0; i < n; ++i) {
      const double b = std::fma(mu, buf[i], g[i]);
      buf[i] = static_cast<float>(b);
      w[i] = static_cast<float>(std::fma(-lr, std::fma(mu, b, g[i]), w[i]));
    }
    opt.step(g.data());
    ASSERT_EQ(opt.weights(), w) << "step " << t;
    ASSERT_EQ(opt.momentum(), buf) << "step " << t;
  }
}

// lr 1, momentum 0 on the averaged pseudo-gradient: the new outer weights are the islands' mean
// inner weights (Note [Outer step]).
TEST(DilocoOuter, LrOneNoMomentumAveragesInnerWeights) {
  std::mt19937 rng(7);
  const int64_t n = 257;
  const int islands = 3;
  OuterOptimizer opt({1.0, 0.0, false}, n);
  for (int round = 0; round < 3; ++round) {
    if (round == 0) opt.weights() = normal(rng, n, 1.0f);
    const std::vector<float> outer = opt.weights();
    std::vector<std::vector<float>> inner;
    for (int k = 0; k < islands; ++k) {
      inner.push_back(outer);
      const std::vector<float> drift = normal(rng, n, 0.05f);
      for (int64_t i = 0; i < n; ++i) inner[k][i] += drift[i];
    }
    std::vector<float> g(n);
    std::vector<double> mean(n, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int k = 0; k < islands; ++k) {
        s += static_cast<double>(outer[i]) - inner[k][i];
        mean[i] += inner[k][i] / static_cast<double>(islands);
      }
      g[i] = static_cast<float>(s / islands);
    }
    opt.step(g.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(opt.weights()[i], mean[i], 1e-6) << i;
  }
  EXPECT_TRUE(opt.momentum().empty());
  EXPECT_EQ(opt.steps(), 3);
}

// The state (weights, buffer, step count) moved to a fresh optimizer continues identically.
TEST(DilocoOuter, StateRestoresExactly) {
  std::mt19937 rng(9);
  const int64_t n = 100;
  OuterOptimizer a({}, n), b({}, n);
  a.weights() = normal(rng, n, 1.0f);
  for (int t = 0; t < 3; ++t) a.step(normal(rng, n, 0.1f).data());
  b.weights() = a.weights();
  b.momentum() = a.momentum();
  b.set_steps(a.steps());
  const std::vector<float> g = normal(rng, n, 0.1f);
  a.step(g.data());
  b.step(g.data());
  EXPECT_EQ(a.weights(), b.weights());
  EXPECT_EQ(a.momentum(), b.momentum());
  EXPECT_EQ(b.steps(), 4);
}

TEST(DilocoOuter, DefaultsAndChecks) {
  const OuterOptions d;
  EXPECT_EQ(d.lr, 0.7);
  EXPECT_EQ(d.momentum, 0.9);
  EXPECT_TRUE(d.nesterov);
  EXPECT_THROW(OuterOptimizer({0.7, 1.0, true}, 4), Error);
  EXPECT_THROW(OuterOptimizer({0.7, -0.1, true}, 4), Error);
  EXPECT_THROW(OuterOptimizer({-1.0, 0.9, true}, 4), Error);
  EXPECT_THROW(OuterOptimizer({NAN, 0.9, true}, 4), Error);
  EXPECT_THROW(OuterOptimizer({}, -1), Error);
  OuterOptimizer opt({}, 4);
  EXPECT_THROW(opt.set_steps(-1), Error);
  opt.weights().resize(3);  // a caller that filled the wrong size
  const float g[4] = {};
  EXPECT_THROW(opt.step(g), Error);
  EXPECT_EQ(opt.steps(), 0);
  OuterOptimizer empty({}, 0);
  empty.step(nullptr);
  EXPECT_EQ(empty.steps(), 1);
}

}  // namespace
}  // namespace loom::parallel::diloco
