// tests/core/rng_test.cpp — Philox known-answer values, reproducibility across thread counts,
// and the moments of the distributions.
#include "core/rng.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "core/philox.h"

namespace loom {
namespace {

TEST(Philox, KnownAnswer) {
  // Random123's known-answer vector for philox4x32_10 with counter 0 and key 0.
  const Philox4 r = philox4x32(0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

TEST(Rng, SameSeedAndOffsetSameNumbersWhateverTheThreadCount) {
  const int saved = omp_get_max_threads();
  std::vector<double> ref;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Generator g(42);
    g.reserve(1000);                             // start at a non-zero offset
    Tensor t = randn({100003}, g, DType::kF32);  // large enough to be split across threads
    if (ref.empty()) {
      ref = t.to_vector();
    } else {
      EXPECT_EQ(t.to_vector(), ref) << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
}

TEST(Rng, OffsetsAdvanceAndStatesRestore) {
  Generator g(7);
  const GeneratorState s0 = g.state();
  Tensor a = rand({10}, g);
  Tensor b = rand({10}, g);
  EXPECT_NE(a.to_vector(), b.to_vector());
  EXPECT_EQ(g.state().offset, s0.offset + 6);  // ceil(10/4) counters per draw
  g.set_state(s0);
  EXPECT_EQ(rand({10}, g).to_vector(), a.to_vector());
  Generator other(8);
  EXPECT_NE(rand({10}, other).to_vector(), a.to_vector());
}

TEST(Rng, DistributionMoments) {
  Generator g(1);
  const int64_t n = 200000;
  const auto z = randn({n}, g, DType::kF64, 2.0, 3.0).to_vector();
  double m = 0, v = 0;
  for (double x : z) m += x;
  m /= n;
  for (double x : z) v += (x - m) * (x - m);
  v /= n;
  EXPECT_NEAR(m, 2.0, 0.05);
  EXPECT_NEAR(std::sqrt(v), 3.0, 0.05);
  const auto u = rand({n}, g, DType::kF64, -1.0, 1.0).to_vector();
  double um = 0, lo = 1, hi = -1;
  for (double x : u) {
    um += x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_NEAR(um / n, 0.0, 0.01);
  EXPECT_GE(lo, -1.0);
  EXPECT_LT(hi, 1.0);
  const auto k = randint({n}, 3, 7, g).to_vector();
  int counts[4] = {};
  for (double x : k) {
    ASSERT_GE(x, 3);
    ASSERT_LT(x, 7);
    ++counts[static_cast<int>(x) - 3];
  }
  for (int c : counts) EXPECT_NEAR(c, n / 4, n / 100);
}

}  // namespace
}  // namespace loom
