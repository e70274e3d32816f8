// tests/core/ops/elementwise_test.cpp — add/sub/mul/div/scale (with broadcasting) and sum/mean:
// gradients against finite differences in f64, f32 against f64.
#include "core/ops/elementwise.h"

#include "core/ops/reduce.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::expect_f32_matches_f64;
using testing::expect_gradcheck;
using testing::random;

struct BinCase {
  Shape a, b;
};

class BinaryOpTest : public ::testing::TestWithParam<BinCase> {};

TEST_P(BinaryOpTest, GradientsMatchFiniteDifferences) {
  Generator gen(7);
  const BinCase c = GetParam();
  for (auto op : {ops::add, ops::sub, ops::mul}) {
    Tensor a = random(c.a, gen), b = random(c.b, gen);
    expect_gradcheck([op](const std::vector<Tensor>& in) { return op(in[0], in[1]); }, {a, b});
    expect_f32_matches_f64([op](const std::vector<Tensor>& in) { return op(in[0], in[1]); },
                           {a, b});
  }
  // div: keep the divisor away from zero.
  Tensor a = random(c.a, gen);
  Tensor b = ops::add(randn(c.b, gen, DType::kF64, 0.0, 0.1), Tensor::full(c.b, 2.0, DType::kF64));
  b.set_requires_grad(true);
  auto div = [](const std::vector<Tensor>& in) { return ops::div(in[0], in[1]); };
  expect_gradcheck(div, {a, b});
  expect_f32_matches_f64(div, {a, b});
}

INSTANTIATE_TEST_SUITE_P(Shapes, BinaryOpTest,
                         ::testing::Values(BinCase{{3, 17}, {3, 17}}, BinCase{{1}, {1}},
                                           BinCase{{3, 17}, {17}},           // bias
                                           BinCase{{2, 3, 5}, {3, 1}},       // middle broadcast
                                           BinCase{{65}, {1}},               // scalar-like
                                           BinCase{{4, 1, 3}, {1, 5, 1}}));  // both broadcast

TEST(Elementwise, ScaleAndInPlaceAdd) {
  Generator gen(1);
  Tensor x = random({3, 17}, gen);
  expect_gradcheck([](const std::vector<Tensor>& in) { return ops::scale(in[0], -2.5); }, {x});
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

TEST(Reduce, SumAndMeanGradients) {
  Generator gen(3);
  for (const Shape& s : {Shape{1}, Shape{3, 17}, Shape{2, 65, 3}}) {
    for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
      Tensor x = random(s, gen);
      for (bool keep : {false, true}) {
        expect_gradcheck(
            [d, keep](const std::vector<Tensor>& in) { return ops::sum(in[0], d, keep); }, {x});
        expect_gradcheck(
            [d, keep](const std::vector<Tensor>& in) { return ops::mean(in[0], d, keep); }, {x});
        expect_f32_matches_f64([d](const std::vector<Tensor>& in) { return ops::sum(in[0], d); },
                               {x});
      }
    }
    Tensor x = random(s, gen);
    expect_gradcheck([](const std::vector<Tensor>& in) { return ops::mean(in[0]); }, {x});
  }
}

TEST(Reduce, SumSquares) {
  Generator gen(5);
  for (const Shape& s : {Shape{1}, Shape{3, 17}, Shape{65, 1031}}) {
    Tensor x = random(s, gen);
    double ref = 0;
    for (double v : x.to_vector()) ref += v * v;
    EXPECT_NEAR(ops::sum_squares(x).item(), ref, 1e-12 * ref);
    if (x.numel() < 1000)
      expect_gradcheck([](const std::vector<Tensor>& in) { return ops::sum_squares(in[0]); }, {x});
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
