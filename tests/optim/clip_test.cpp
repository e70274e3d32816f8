// tests/optim/clip_test.cpp — global gradient norm in double, clipping to exactly max_norm,
// untouched gradients below the threshold, non-contiguous and undefined gradients, and the
// factor computed from a sum of squares where it lies.
#include "optim/clip.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "core/rng.h"

namespace loom {
namespace {

double reference_sq_sum(const std::vector<Tensor>& ts) {
  double s = 0;
  for (const Tensor& t : ts) {
    if (!t.defined()) continue;
    for (double x : t.to_vector()) s += x * x;
  }
  return s;
}

TEST(Clip, NormMatchesReference) {
  Generator gen(9);
  std::vector<Tensor> g = {randn({33, 17}, gen), Tensor(), randn({5}, gen, DType::kF64),
                           randn({70001}, gen)};
  const double ref = reference_sq_sum(g);
  EXPECT_NEAR(optim::grad_sq_sum(g), ref, 1e-10 * ref);
  EXPECT_NEAR(optim::global_grad_norm(g), std::sqrt(ref), 1e-10 * std::sqrt(ref));
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = optim::grad_sq_sum(g);
  omp_set_num_threads(2);
  const double two = optim::grad_sq_sum(g);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

TEST(Clip, ScalesToExactlyMaxNorm) {
  Generator gen(10);
  Tensor a = randn({8, 9}, gen, DType::kF64), b = randn({9}, gen, DType::kF64);
  Tensor base = randn({9, 8}, gen, DType::kF64);
  Tensor c = base.transpose(0, 1);  // a non-contiguous gradient view
  const std::vector<Tensor> grads = {a, b, c};
  const double before = optim::global_grad_norm(grads);
  const std::vector<double> a0 = a.to_vector();
  const double max_norm = before / 3;
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm(grads, max_norm), before);
  EXPECT_NEAR(optim::global_grad_norm(grads), max_norm, 1e-12 * max_norm);
  const std::vector<double> a1 = a.to_vector();
  for (size_t i = 0; i < a0.size(); ++i) EXPECT_NEAR(a1[i], a0[i] / 3, 1e-14);
  EXPECT_NEAR(optim::global_grad_norm({base}), optim::global_grad_norm({c}), 1e-14);
}

TEST(Clip, F32ScalesToMaxNorm) {
  Generator gen(12);
  const std::vector<Tensor> grads = {randn({100, 37}, gen), randn({37}, gen)};
  const double before = optim::clip_grad_norm(grads, 1.0);
  EXPECT_GT(before, 1.0);
  EXPECT_NEAR(optim::global_grad_norm(grads), 1.0, 1e-6);
}

TEST(Clip, BelowThresholdLeavesBitsUnchanged) {
  Generator gen(13);
  Tensor a = randn({10, 10}, gen);
  const std::vector<double> before = a.to_vector();
  const double norm = optim::clip_grad_norm({a}, 1e6);
  EXPECT_GT(norm, 0);
  EXPECT_EQ(a.to_vector(), before);
  EXPECT_THROW(optim::clip_grad_norm({a}, 0.0), Error);
  EXPECT_EQ(optim::clip_scale(INFINITY, 1.0), 1.0);
  EXPECT_EQ(optim::clip_scale(4.0, 1.0), 0.25);
}

// The factor computed where the sum of squares lies (the device step's clipping) is the host's
// clip_scale of its square root, for norms below, at and above max_norm, zero, inf and NaN.
TEST(Clip, FactorTensorIsTheHostFactor) {
  const double max_norm = 1.5;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (const double sq : {0.0, 0.25, 2.25, 2.2500001, 9.0, 1e300, inf, nan}) {
    const double got = optim::clip_scale_tensor(Tensor::scalar(sq, DType::kF64), max_norm).item();
    EXPECT_EQ(got, optim::clip_scale(std::sqrt(sq), max_norm)) << "sum of squares " << sq;
  }
  EXPECT_DOUBLE_EQ(optim::clip_scale_tensor(Tensor::scalar(9.0, DType::kF64), max_norm).item(),
                   0.5);
  EXPECT_EQ(optim::clip_scale_tensor(Tensor::scalar(nan, DType::kF64), max_norm).item(), 1.0);
  EXPECT_THROW(optim::clip_scale_tensor(Tensor::scalar(1.0, DType::kF64), 0.0), Error);
  EXPECT_THROW(optim::clip_scale_tensor(Tensor::scalar(1.0, DType::kF32), 1.0), Error);
}

}  // namespace
}  // namespace loom
