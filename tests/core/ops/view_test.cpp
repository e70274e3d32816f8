// tests/core/ops/view_test.cpp — gradients through views and layout ops (reshape, transpose,
// permute, narrow, expand, cat, split, dtype casts) against finite differences.
#include "core/ops/view.h"

#include "core/ops/elementwise.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::expect_gradcheck;
using testing::random;

TEST(ViewGrad, ReshapeTransposePermute) {
  Generator gen(21);
  Tensor x = random({3, 17, 2}, gen);
  expect_gradcheck([](const std::vector<Tensor>& in) { return in[0].reshape({17, 6}); }, {x});
  expect_gradcheck([](const std::vector<Tensor>& in) { return in[0].transpose(0, 2); }, {x});
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return in[0].permute({1, 2, 0}).reshape({-1});
      },
      {x});
}

TEST(ViewGrad, NarrowAndExpand) {
  Generator gen(22);
  Tensor x = random({5, 17}, gen);
  expect_gradcheck([](const std::vector<Tensor>& in) { return in[0].narrow(1, 3, 9); }, {x});
  Tensor b = random({1, 17}, gen);
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return in[0].expand({4, 1, 17}).contiguous();
      },
      {b});
}

TEST(ViewGrad, CatAndSplit) {
  Generator gen(23);
  Tensor a = random({3, 1}, gen), b = random({3, 17}, gen), c = random({3, 5}, gen);
  expect_gradcheck([](const std::vector<Tensor>& in) { return ops::cat(in, 1); }, {a, b, c});
  Tensor x = random({2, 23}, gen);
  // Only some outputs of split are used: the others get no gradient, treated as zero.
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        auto parts = ops::split(in[0], {1, 17, 5}, 1);
        return ops::cat({ops::scale(parts[2], 3.0), parts[0]}, 1);
      },
      {x});
}

TEST(ViewGrad, DTypeCastIsDifferentiable) {
  Generator gen(24);
  Tensor x = random({3, 17}, gen);
  Tensor y = ops::scale(x.to(DType::kF32), 2.0);
  autograd::backward(ops::sum(y));
  EXPECT_EQ(x.grad().dtype(), DType::kF64);
  for (double v : x.grad().to_vector()) EXPECT_DOUBLE_EQ(v, 2.0);
}

}  // namespace
}  // namespace loom
