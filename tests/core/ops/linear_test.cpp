// tests/core/ops/linear_test.cpp — the fused Linear ops (ops::linear, ops::linear_gelu,
// ops::gelu_mlp) and their kernels (gemm_bias, gemm_bias_gelu, gemm_dgelu_bgrad) on the CPU:
// equality with the unfused composition (matmul + add [+ gelu] [+ matmul + add]) in value and
// gradient, the kernels against their definitions, memory held, shape errors. Gradients against
// central differences in f64 and f32 against f64 (and other backends) are the conformance
// table's linear, linear_gelu and gelu_mlp cases (tests/conformance/cases/linear.cpp).
#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/ops/activation.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "kernels/matmul.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::random;
using testing::rel_error;

struct LinearCase {
  Shape x;
  int64_t out;
};

const std::vector<LinearCase> kCases = {{{1, 1}, 1}, {{3, 17}, 5}, {{2, 3, 7}, 9}, {{17, 4}, 65}};

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

// fn(ta, tb, a, b) for every transpose form, with random f64 a, b of op(a) (m, k), op(b) (k, n).
template <typename Fn>
void for_each_transpose(Generator& gen, int64_t m, int64_t n, int64_t k, Fn fn) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Tensor a = random(ta ? Shape{k, m} : Shape{m, k}, gen, DType::kF64, false);
      const Tensor b = random(tb ? Shape{n, k} : Shape{k, n}, gen, DType::kF64, false);
      fn(ta, tb, a, b);
    }
  }
}

TEST(LinearKernels, GemmBiasIsGemmThenBiasRows) {
  // The kernels directly, in every transpose form: c = op(a)·op(b) + bias, pre likewise and
  // out = gelu(pre); c, pre and out start as NaN, so an element left unwritten fails.
  Generator gen(24);
  const int64_t m = 5, n = 7, k = 3;
  for_each_transpose(gen, m, n, k, [&](bool ta, bool tb, const Tensor& a, const Tensor& b) {
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
  });
}

// x (…, C), hidden H.
struct MlpCase {
  Shape x;
  int64_t hidden;
};
const std::vector<MlpCase> kMlpCases = {{{1, 1}, 1}, {{3, 5}, 7}, {{2, 3, 4}, 16}, {{9, 6}, 2}};

std::vector<Tensor> mlp_inputs(const MlpCase& c, Generator& gen, DType dt = DType::kF64) {
  const int64_t C = c.x.back(), H = c.hidden;
  return {random(c.x, gen, dt), random({H, C}, gen, dt), random({H}, gen, dt),
          random({C, H}, gen, dt), random({C}, gen, dt)};
}

Tensor fused_mlp(const std::vector<Tensor>& in) {
  return ops::gelu_mlp(in[0], in[1], in[2], in[3], in[4]);
}
Tensor unfused_mlp(const std::vector<Tensor>& in) {
  const Tensor h = ops::gelu(ops::add(ops::matmul(in[0], in[1], false, true), in[2]));
  return ops::add(ops::matmul(h, in[3], false, true), in[4]);
}

TEST(GeluMlp, EqualsTheUnfusedLayers) {
  Generator gen(26);
  for (DType dt : {DType::kF64, DType::kF32}) {
    for (const MlpCase& c : kMlpCases) {
      std::vector<Tensor> a = mlp_inputs(c, gen, dt), b;
      for (const Tensor& t : a) b.push_back(t.detach().clone().set_requires_grad(true));
      const Tensor ya = fused_mlp(a), yb = unfused_mlp(b);
      ASSERT_EQ(ya.shape(), yb.shape());
      const double tol = dt == DType::kF64 ? 1e-13 : 2e-6;
      EXPECT_LT(rel_error(ya, yb), tol) << shape_str(c.x);
      const Tensor w = randn(ya.shape(), gen, dt);
      autograd::backward(testing::weighted_sum(ya, w));
      autograd::backward(testing::weighted_sum(yb, w));
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_LT(rel_error(a[i].grad(), b[i].grad()), tol)
            << "gradient " << i << " " << shape_str(c.x);
      }
    }
  }
}

TEST(GeluMlp, GradientOfSomeInputsOnly) {
  // Frozen fc layer: only the projection and the input get gradients.
  Generator gen(27);
  std::vector<Tensor> in = mlp_inputs({{4, 3}, 5}, gen);
  in[1] = in[1].detach();
  in[2] = in[2].detach();
  autograd::backward(ops::sum(fused_mlp(in)));
  EXPECT_TRUE(in[0].grad().defined() && in[3].grad().defined() && in[4].grad().defined());
  EXPECT_FALSE(in[1].grad().defined() || in[2].grad().defined());
}

TEST(GeluMlp, KeepsOneHiddenActivationLessThanTheUnfusedLayers) {
  // After the forward, the unfused layers hold pre and gelu(pre) for their backward; gelu_mlp
  // holds pre only (it recomputes gelu(pre) in the backward).
  Generator gen(29);
  const MlpCase c{{64, 32}, 128};
  const int64_t hidden_bytes = 64 * 128 * 8;  // one (R, H) f64 activation
  Allocator& alloc = allocator_for(DeviceType::kCpu);
  auto held_after_forward = [&](const testing::OpFn& fn) {
    const std::vector<Tensor> in = mlp_inputs(c, gen);
    const int64_t before = alloc.stats().current_bytes;
    const Tensor y = fn(in);
    return alloc.stats().current_bytes - before;
  };
  const int64_t fused = held_after_forward(fused_mlp), unfused = held_after_forward(unfused_mlp);
  EXPECT_GE(unfused - fused, hidden_bytes)
      << "fused " << fused << " B, unfused " << unfused << " B";
}

TEST(LinearKernels, GemmDgeluBgradIsGemmThenGeluBackwardThenColumnSum) {
  // dpre = (op(a)·op(b)) ⊙ gelu'(pre), dbias = Σ_rows dpre, in every transpose form; outputs
  // start as NaN so an element left unwritten fails.
  Generator gen(28);
  const int64_t m = 6, n = 5, k = 4;
  for_each_transpose(gen, m, n, k, [&](bool ta, bool tb, const Tensor& a, const Tensor& b) {
    Tensor pre = random({m, n}, gen, DType::kF64, true);
    Tensor dpre = Tensor::full({m, n}, NAN, DType::kF64),
           dbias = Tensor::full({n}, NAN, DType::kF64);
    kernels::call_kernel<kernels::gemm_dgelu_bgrad_k>(a, b, pre, dpre, dbias, ta, tb);
    const Tensor dy = ops::matmul(a, b, ta, tb);
    autograd::backward({ops::gelu(pre)}, {dy});
    EXPECT_LT(rel_error(dpre, pre.grad()), 1e-14);
    EXPECT_LT(rel_error(dbias, ops::sum(pre.grad(), 0)), 1e-14);
  });
  Tensor dpre = Tensor::zeros({2, 4}, DType::kF64), short_bias = Tensor::zeros({3}, DType::kF64);
  EXPECT_THROW(kernels::call_kernel<kernels::gemm_dgelu_bgrad_k>(
                   Tensor::zeros({2, 3}, DType::kF64), Tensor::zeros({3, 4}, DType::kF64),
                   Tensor::zeros({2, 4}, DType::kF64), dpre, short_bias, false, false),
               Error);
}

TEST(Linear, ShapeErrors) {
  EXPECT_THROW(ops::linear(Tensor::zeros({3, 4}), Tensor::zeros({5, 6}), Tensor::zeros({5})),
               Error);
  EXPECT_THROW(ops::linear(Tensor::zeros({3, 4}), Tensor::zeros({5, 4}), Tensor::zeros({4})),
               Error);
  EXPECT_THROW(ops::linear_gelu(Tensor::zeros({3, 4}), Tensor::zeros({5, 4}), Tensor()), Error);
  const Tensor x = Tensor::zeros({3, 4}), w1 = Tensor::zeros({6, 4}), b1 = Tensor::zeros({6});
  EXPECT_THROW(ops::gelu_mlp(x, w1, b1, Tensor::zeros({4, 5}), Tensor::zeros({4})),
               Error);  // w_proj not (4, 6)
  EXPECT_THROW(ops::gelu_mlp(x, w1, b1, Tensor::zeros({4, 6}), Tensor::zeros({6})),
               Error);  // b_proj not (4)
  EXPECT_THROW(ops::gelu_mlp(x, w1, b1, Tensor::zeros({4, 6}), Tensor()), Error);
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
