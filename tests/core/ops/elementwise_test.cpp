// tests/core/ops/elementwise_test.cpp — in-place add_, broadcast errors, sum and sum_squares
// values against loops. Gradients of add/sub/mul/div/scale (with broadcasting), sum, mean and
// sum_squares (finite differences in f64, f32 against f64, other backends) are the conformance
// table's cases (tests/conformance/cases/elementwise.cpp, reduce.cpp).
#include "core/ops/elementwise.h"

#include "core/ops/reduce.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::random;

TEST(Elementwise, InPlaceAdd) {
  Generator gen(1);
  Tensor x = random({3, 17}, gen);
  Tensor acc = Tensor::zeros({3, 17}, DType::kF64);
  ops::add_(acc, x, 2.0);
  ops::add_(acc, x, -0.5);
  const auto xv = x.to_vector(), av = acc.to_vector();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_DOUBLE_EQ(av[i], 1.5 * xv[i]);
}

TEST(Elementwise, MismatchedShapesNameTheOp) {
  Tensor a = Tensor::zeros({3, 4}), b = Tensor::zeros({5});
  try {
    ops::add(a, b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add: shapes (3, 4) and (5) do not broadcast"),
              std::string::npos)
        << e.what();
  }
}

TEST(Reduce, SumSquaresValuesAgainstLoop) {
  Generator gen(5);
  for (const Shape& s : {Shape{1}, Shape{3, 17}, Shape{65, 1031}}) {
    Tensor x = random(s, gen);
    double ref = 0;
    for (double v : x.to_vector()) ref += v * v;
    EXPECT_NEAR(ops::sum_squares(x).item(), ref, 1e-12 * ref);
  }
}

TEST(Reduce, SumValuesAgainstLoop) {
  Generator gen(4);
  Tensor x = random({4, 5, 6}, gen, DType::kF64, false);
  Tensor s = ops::sum(x, 1);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t k = 0; k < 6; ++k) {
      double ref = 0;
      for (int64_t j = 0; j < 5; ++j) ref += x.at({i, j, k});
      EXPECT_NEAR(s.at({i, k}), ref, 1e-12);
    }
  }
}

}  // namespace
}  // namespace loom
