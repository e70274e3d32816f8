// tests/core/ops/activation_test.cpp — gelu, silu and swiglu: forward values against a scalar
// reference loop, saturation at extreme inputs, shape errors. Gradients (finite differences in
// f64, f32 against f64, other backends) are the conformance table's gelu, silu and swiglu cases
// (tests/conformance/cases/activation.cpp).
#include "core/ops/activation.h"

#include <cmath>

#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::random;

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }

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

TEST(Activation, ExtremeValues) {
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
