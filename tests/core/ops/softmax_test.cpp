// tests/core/ops/softmax_test.cpp — softmax over the last dim: values against a reference loop,
// and stability. Gradients (finite differences in f64, f32 against f64, other backends; a
// transposed input) are the conformance table's softmax cases
// (tests/conformance/cases/softmax.cpp).
#include "core/ops/softmax.h"

#include <cmath>

#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::random;

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

}  // namespace
}  // namespace loom
