// tests/core/ops/linear_test.cpp — the fused Linear ops (ops::linear, ops::linear_gelu) and
// their kernels (gemm_bias, gemm_bias_gelu) on the CPU: gradients against central differences
// in f64, f32 against f64, and equality with the unfused composition
// (matmul + add [+ gelu]) in value and gradient.
#include <gtest/gtest.h>

#include "core/ops/activation.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "kernels/matmul.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::expect_f32_matches_f64;
using testing::expect_gradcheck;
using testing::random;
using testing::rel_error;

struct LinearCase {
  Shape x;
  int64_t out;
};

const std::vector<LinearCase> kCases = {{{1, 1}, 1}, {{3, 17}, 5}, {{2, 3, 7}, 9}, {{17, 4}, 65}};

TEST(Linear, GradcheckWithAndWithoutBias) {
  Generator gen(21);
  for (const LinearCase& c : kCases) {
    Tensor x = random(c.x, gen), w = random({c.out, c.x.back()}, gen), b = random({c.out}, gen);
    auto with_bias = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); };
    auto without = [](const std::vector<Tensor>& in) {
      return ops::linear(in[0], in[1], Tensor());
    };
    expect_gradcheck(with_bias, {x, w, b});
    expect_gradcheck(without, {x, w});
    expect_f32_matches_f64(with_bias, {x, w, b}, 1e-5);
  }
}

TEST(LinearGelu, Gradcheck) {
  Generator gen(22);
  for (const LinearCase& c : kCases) {
    Tensor x = random(c.x, gen), w = random({c.out, c.x.back()}, gen), b = random({c.out}, gen);
    auto fn = [](const std::vector<Tensor>& in) { return ops::linear_gelu(in[0], in[1], in[2]); };
    expect_gradcheck(fn, {x, w, b});
    expect_f32_matches_f64(fn, {x, w, b}, 1e-5);
  }
}

// Value and all three gradients of fused(x, w, b) against unfused(x, w, b).
void expect_same_as_unfused(const testing::OpFn& fused, const testing::OpFn& unfused, DType dt,
                            double tol) {
  Generator gen(23);
  for (const LinearCase& c : kCases) {
    std::vector<Tensor> a = {random(c.x, gen, dt), random({c.out, c.x.back()}, gen, dt),
                             random({c.out}, gen, dt)};
    std::vector<Tensor> b;
    for (const Tensor& t : a) b.push_back(t.detach().clone().set_requires_grad(true));
    const Tensor ya = fused(a), yb = unfused(b);
    ASSERT_EQ(ya.shape(), yb.shape());
    EXPECT_LT(rel_error(ya, yb), tol) << "forward " << shape_str(c.x);
    const Tensor w = randn(ya.shape(), gen, dt);
    autograd::backward(testing::weighted_sum(ya, w));
    autograd::backward(testing::weighted_sum(yb, w));
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_LT(rel_error(a[i].grad(), b[i].grad()), tol)
          << "gradient " << i << " " << shape_str(c.x);
    }
  }
}

TEST(Linear, EqualsMatmulPlusBias) {
  auto fused = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); };
  auto unfused = [](const std::vector<Tensor>& in) {
    return ops::add(ops::matmul(in[0], in[1], false, true), in[2]);
  };
  expect_same_as_unfused(fused, unfused, DType::kF64, 1e-14);
  expect_same_as_unfused(fused, unfused, DType::kF32, 1e-6);
}

TEST(LinearGelu, EqualsGeluOfMatmulPlusBias) {
  auto fused = [](const std::vector<Tensor>& in) { return ops::linear_gelu(in[0], in[1], in[2]); };
  auto unfused = [](const std::vector<Tensor>& in) {
    return ops::gelu(ops::add(ops::matmul(in[0], in[1], false, true), in[2]));
  };
  expect_same_as_unfused(fused, unfused, DType::kF64, 1e-14);
  expect_same_as_unfused(fused, unfused, DType::kF32, 1e-6);
}

TEST(LinearKernels, GemmBiasIsGemmThenBiasRows) {
  // The kernels directly, in every transpose form: c = op(a)·op(b) + bias, pre likewise and
  // out = gelu(pre); c, pre and out start as NaN, so an element left unwritten fails.
  Generator gen(24);
  const int64_t m = 5, n = 7, k = 3;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Tensor a = random(ta ? Shape{k, m} : Shape{m, k}, gen, DType::kF64, false);
      const Tensor b = random(tb ? Shape{n, k} : Shape{k, n}, gen, DType::kF64, false);
      const Tensor bias = random({n}, gen, DType::kF64, false);
      Tensor c = Tensor::full({m, n}, NAN, DType::kF64);
      Tensor pre = Tensor::full({m, n}, NAN, DType::kF64);
      Tensor out = Tensor::full({m, n}, NAN, DType::kF64);
      kernels::call_kernel<kernels::gemm_bias_k>(a, b, bias, c, ta, tb);
      kernels::call_kernel<kernels::gemm_bias_gelu_k>(a, b, bias, pre, out, ta, tb);
      const Tensor want = ops::add(ops::matmul(a, b, ta, tb), bias);
      EXPECT_LT(rel_error(c, want), 1e-14);
      EXPECT_LT(rel_error(pre, want), 1e-14);
      EXPECT_LT(rel_error(out, ops::gelu(want)), 1e-14);
    }
  }
}

TEST(Linear, ShapeErrors) {
  EXPECT_THROW(ops::linear(Tensor::zeros({3, 4}), Tensor::zeros({5, 6}), Tensor::zeros({5})),
               Error);
  EXPECT_THROW(ops::linear(Tensor::zeros({3, 4}), Tensor::zeros({5, 4}), Tensor::zeros({4})),
               Error);
  EXPECT_THROW(ops::linear_gelu(Tensor::zeros({3, 4}), Tensor::zeros({5, 4}), Tensor()), Error);
}

TEST(Tf32Guard, ScopedAndOffByDefault) {
  EXPECT_FALSE(kernels::tf32_allowed());
  {
    kernels::AllowTf32Guard on;
    EXPECT_TRUE(kernels::tf32_allowed());
    {
      kernels::AllowTf32Guard off(false);
      EXPECT_FALSE(kernels::tf32_allowed());
    }
    EXPECT_TRUE(kernels::tf32_allowed());
  }
  EXPECT_FALSE(kernels::tf32_allowed());
}

}  // namespace
}  // namespace loom
