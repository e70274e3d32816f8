// tests/core/ops/activation_test.cpp — gelu, silu and swiglu: gradients against finite differences
// in f64, f32 against f64, and forward values against a scalar reference loop.
#include "core/ops/activation.h"

#include <cmath>

#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::expect_f32_matches_f64;
using testing::expect_gradcheck;
using testing::random;

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }

class ActivationShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(ActivationShapes, GeluGradientsMatchFiniteDifferences) {
  Generator gen(11);
  Tensor x = random(GetParam(), gen, DType::kF64, true, 2.0);
  auto fn = [](const std::vector<Tensor>& in) { return ops::gelu(in[0]); };
  expect_gradcheck(fn, {x});
  expect_f32_matches_f64(fn, {x});
}

TEST_P(ActivationShapes, SiluGradientsMatchFiniteDifferences) {
  Generator gen(12);
  Tensor x = random(GetParam(), gen, DType::kF64, true, 2.0);
  auto fn = [](const std::vector<Tensor>& in) { return ops::silu(in[0]); };
  expect_gradcheck(fn, {x});
  expect_f32_matches_f64(fn, {x});
}

TEST_P(ActivationShapes, SwigluGradientsMatchFiniteDifferences) {
  Generator gen(13);
  Tensor gate = random(GetParam(), gen, DType::kF64, true, 2.0);
  Tensor up = random(GetParam(), gen);
  auto fn = [](const std::vector<Tensor>& in) { return ops::swiglu(in[0], in[1]); };
  expect_gradcheck(fn, {gate, up});
  expect_f32_matches_f64(fn, {gate, up});
}

INSTANTIATE_TEST_SUITE_P(Shapes, ActivationShapes,
                         ::testing::Values(Shape{1}, Shape{3}, Shape{17}, Shape{65}, Shape{3, 17},
                                           Shape{2, 3, 65}));

TEST(Activation, ValuesMatchReferenceLoop) {
  Generator gen(14);
  Tensor x = random({5, 17}, gen, DType::kF64, false, 3.0);
  Tensor u = random({5, 17}, gen, DType::kF64, false);
  const auto xv = x.to_vector(), uv = u.to_vector();
  const auto g = ops::gelu(x).to_vector(), s = ops::silu(x).to_vector();
  const auto sw = ops::swiglu(x, u).to_vector();
  for (size_t i = 0; i < xv.size(); ++i) {
    EXPECT_NEAR(g[i], gelu_ref(xv[i]), 1e-14 * (1 + std::abs(xv[i])));
    EXPECT_NEAR(s[i], silu_ref(xv[i]), 1e-14 * (1 + std::abs(xv[i])));
    EXPECT_NEAR(sw[i], silu_ref(xv[i]) * uv[i], 1e-13 * (1 + std::abs(xv[i] * uv[i])));
  }
}

TEST(Activation, NonContiguousInputAndExtremeValues) {
  Generator gen(15);
  Tensor x = random({17, 3}, gen);
  auto fn = [](const std::vector<Tensor>& in) { return ops::gelu(in[0].transpose(0, 1)); };
  expect_gradcheck(fn, {x});
  Tensor big = Tensor::from_vector(std::vector<double>{-1000.0, -50.0, 50.0, 1000.0}, {4});
  for (const Tensor& y : {ops::gelu(big), ops::silu(big), ops::gelu(big.to(DType::kF32)),
                          ops::silu(big.to(DType::kF32))}) {
    const auto v = y.to_vector();
    EXPECT_EQ(v[0], 0.0);
    EXPECT_NEAR(v[1], 0.0, 1e-15);
    EXPECT_NEAR(v[2], 50.0, 1e-5);
    EXPECT_EQ(v[3], 1000.0);
  }
}

TEST(Activation, SwigluRejectsMismatchedShapes) {
  Tensor a = Tensor::zeros({3, 4}), b = Tensor::zeros({4, 3});
  EXPECT_THROW(ops::swiglu(a, b), Error);
}

}  // namespace
}  // namespace loom
