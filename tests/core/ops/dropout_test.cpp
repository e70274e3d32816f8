// tests/core/ops/dropout_test.cpp — dropout: the documented Philox mask rule, reproducibility
// from (seed, offset), keep rate, backward reusing the forward mask, thread-count independence,
// and gradients against finite differences (a fresh Generator per call fixes the mask).
#include "core/ops/dropout.h"

#include <omp.h>

#include <cmath>

#include "core/philox.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::expect_f32_matches_f64;
using testing::expect_gradcheck;
using testing::random;

TEST(Dropout, GradientsMatchFiniteDifferences) {
  Generator gen(41);
  for (const Shape& s : {Shape{1}, Shape{3}, Shape{17}, Shape{65}, Shape{3, 65}}) {
    Tensor x = random(s, gen);
    for (double p : {0.1, 0.5}) {
      auto fn = [p](const std::vector<Tensor>& in) {
        Generator g(1234);
        return ops::dropout(in[0], p, g, true);
      };
      expect_gradcheck(fn, {x});
      expect_f32_matches_f64(fn, {x});
    }
  }
}

TEST(Dropout, MaskFollowsThePhiloxRule) {
  const double p = 0.3;
  Generator gen(77);
  gen.reserve(10);  // a non-zero offset
  const uint64_t offset = gen.state().offset;
  Tensor x = Tensor::ones({1001}, DType::kF64);
  const auto y = ops::dropout(x, p, gen, true).to_vector();
  for (size_t i = 0; i < y.size(); ++i) {
    const bool keep = uint_to_unit_float(philox_bits(77, offset, i)) > static_cast<float>(p);
    EXPECT_EQ(y[i], keep ? 1.0 / (1.0 - p) : 0.0) << "element " << i;
  }
}

TEST(Dropout, SameStateSameMaskNewOffsetNewMask) {
  Tensor x = Tensor::ones({4097}, DType::kF32);
  Generator a(9), b(9);
  const auto a1 = ops::dropout(x, 0.5, a, true).to_vector();
  const auto a2 = ops::dropout(x, 0.5, a, true).to_vector();
  const auto b1 = ops::dropout(x, 0.5, b, true).to_vector();
  EXPECT_EQ(a1, b1);
  EXPECT_NE(a1, a2);
  Generator c(10);
  EXPECT_NE(a1, ops::dropout(x, 0.5, c, true).to_vector());
}

TEST(Dropout, KeptFractionIsNearOneMinusP) {
  Generator gen(3);
  const int64_t n = 200000;
  for (double p : {0.1, 0.5, 0.9}) {
    const auto y = ops::dropout(Tensor::ones({n}), p, gen, true).to_vector();
    int64_t kept = 0;
    for (double v : y) kept += v != 0.0;
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.01) << "p = " << p;
  }
}

TEST(Dropout, BackwardUsesTheForwardMask) {
  Generator gen(5);
  Tensor x = random({3, 1000}, gen, DType::kF32);
  Tensor y = ops::dropout(x, 0.25, gen, true);
  autograd::backward(ops::sum(y));
  const auto yv = y.to_vector(), xv = x.to_vector(), gv = x.grad().to_vector();
  const float scale = static_cast<float>(1.0 / 0.75);
  for (size_t i = 0; i < yv.size(); ++i) {
    const bool kept = yv[i] != 0.0;
    EXPECT_EQ(gv[i], kept ? scale : 0.0f) << i;
    if (kept) {
      EXPECT_EQ(yv[i], static_cast<float>(xv[i]) * scale) << i;
    }
  }
}

TEST(Dropout, IdentityWhenNotTrainingOrPZero) {
  Generator data(6), gen(7);
  Tensor x = random({17}, data);
  EXPECT_TRUE(ops::dropout(x, 0.5, gen, false).same(x));
  EXPECT_TRUE(ops::dropout(x, 0.0, gen, true).same(x));
  EXPECT_EQ(gen.state().offset, 0u);
  const auto z = ops::dropout(x, 1.0, gen, true).to_vector();
  for (double v : z) EXPECT_EQ(v, 0.0);
  EXPECT_THROW(ops::dropout(x, 1.5, gen, true), Error);
}

TEST(Dropout, ResultDoesNotDependOnThreadCount) {
  Generator data(8);
  Tensor x = random({100003}, data, DType::kF32);  // several parallel chunks, ragged tail
  auto run = [&](int threads) {
    const int prev = omp_get_max_threads();
    omp_set_num_threads(threads);
    x.zero_grad();
    Generator gen(99);
    Tensor y = ops::dropout(x, 0.4, gen, true);
    autograd::backward(ops::sum(y));
    omp_set_num_threads(prev);
    return std::make_pair(y.to_vector(), x.grad().to_vector());
  };
  EXPECT_EQ(run(1), run(2));
}

}  // namespace
}  // namespace loom
