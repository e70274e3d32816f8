// tests/core/ops/softmax_test.cpp — softmax over the last dim: gradients against finite
// differences in f64, f32 against f64, values against a reference loop, and stability.
#include "core/ops/softmax.h"

#include <cmath>

#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::expect_f32_matches_f64;
using testing::expect_gradcheck;
using testing::random;

class SoftmaxShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(SoftmaxShapes, GradientsMatchFiniteDifferences) {
  Generator gen(31);
  Tensor x = random(GetParam(), gen, DType::kF64, true, 2.0);
  auto fn = [](const std::vector<Tensor>& in) { return ops::softmax(in[0]); };
  expect_gradcheck(fn, {x});
  expect_f32_matches_f64(fn, {x});
}

INSTANTIATE_TEST_SUITE_P(Shapes, SoftmaxShapes,
                         ::testing::Values(Shape{1}, Shape{3}, Shape{17}, Shape{65}, Shape{4, 65},
                                           Shape{2, 3, 17}, Shape{5, 1}));

TEST(Softmax, ValuesMatchReferenceLoop) {
  Generator gen(32);
  const int64_t n = 6, c = 17;
  Tensor x = random({n, c}, gen, DType::kF64, false, 3.0);
  Tensor y = ops::softmax(x);
  for (int64_t i = 0; i < n; ++i) {
    double z = 0;
    for (int64_t j = 0; j < c; ++j) z += std::exp(x.at({i, j}));
    for (int64_t j = 0; j < c; ++j) EXPECT_NEAR(y.at({i, j}), std::exp(x.at({i, j})) / z, 1e-14);
  }
}

TEST(Softmax, LargeLogitsDoNotOverflow) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    Tensor x = Tensor::from_vector(std::vector<double>{1000.0, 999.0, -1000.0}, {1, 3}).to(dt);
    const auto y = ops::softmax(x).to_vector();
    const double e = std::exp(-1.0);
    EXPECT_NEAR(y[0], 1.0 / (1.0 + e), 1e-6);
    EXPECT_NEAR(y[1], e / (1.0 + e), 1e-6);
    EXPECT_EQ(y[2], 0.0);
  }
}

TEST(Softmax, NonContiguousInput) {
  Generator gen(33);
  Tensor x = random({17, 3}, gen);
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return ops::softmax(in[0].transpose(0, 1)); }, {x});
}

}  // namespace
}  // namespace loom
