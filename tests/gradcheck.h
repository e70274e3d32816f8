// tests/gradcheck.h — shared test helpers: random inputs, central-difference gradient checks
// in f64, and the f32-against-f64 comparison. Header-only; used by every op test.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace loom::testing {

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Random normal tensor (never all zeros), optionally a leaf requiring grad.
inline Tensor random(const Shape& shape, Generator& gen, DType dtype = DType::kF64,
                     bool grad = true, double std = 1.0) {
  Tensor t = randn(shape, gen, dtype, 0.0, std);
  if (grad) t.set_requires_grad(true);
  return t;
}

// Relative error ‖a − b‖ / max(‖b‖, tiny); NaN anywhere gives +inf.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}
inline double rel_error(const Tensor& a, const Tensor& b) {
  return rel_error(a.to_vector(), b.to_vector());
}

// The scalar whose gradient is checked: Σ out ⊙ w with fixed random weights w (so every output
// element's gradient matters and no symmetry hides an error).
inline Tensor weighted_sum(const Tensor& out, const Tensor& w) {
  return ops::sum(ops::mul(out, w.to(out.dtype())));
}

// Checks analytic gradients of every input that requires grad against central differences
// (f64 inputs). At most `max_probes` elements per input are probed, chosen at random.
inline void expect_gradcheck(const OpFn& fn, const std::vector<Tensor>& inputs, double eps = 1e-6,
                             double atol = 1e-6, double rtol = 1e-5, int max_probes = 120,
                             uint64_t seed = 1234) {
  for (const Tensor& t : inputs) {
    ASSERT_TRUE(!t.requires_grad() || t.dtype() == DType::kF64) << "gradcheck needs f64 inputs";
  }
  Generator gen(seed);
  Tensor out = fn(inputs);
  Tensor w = randn(out.shape(), gen, DType::kF64);
  for (const Tensor& t : inputs) {
    if (t.requires_grad()) const_cast<Tensor&>(t).zero_grad();
  }
  autograd::backward(weighted_sum(out, w));

  for (size_t j = 0; j < inputs.size(); ++j) {
    const Tensor& x = inputs[j];
    if (!x.requires_grad()) continue;
    ASSERT_TRUE(x.grad().defined()) << "input " << j << " got no gradient";
    ASSERT_TRUE(x.is_contiguous());
    const std::vector<double> analytic = x.grad().to_vector();
    double* p = x.data<double>();
    const int64_t n = x.numel();
    std::vector<int64_t> probes;
    if (n <= max_probes) {
      for (int64_t i = 0; i < n; ++i) probes.push_back(i);
    } else {
      Tensor idx = randint({max_probes}, 0, n, gen);
      for (double v : idx.to_vector()) probes.push_back(static_cast<int64_t>(v));
    }
    for (int64_t i : probes) {
      const double saved = p[i];
      double f_plus, f_minus;
      {
        autograd::NoGradGuard ng;
        p[i] = saved + eps;
        f_plus = weighted_sum(fn(inputs), w).item();
        p[i] = saved - eps;
        f_minus = weighted_sum(fn(inputs), w).item();
      }
      p[i] = saved;
      const double numeric = (f_plus - f_minus) / (2 * eps);
      EXPECT_NEAR(analytic[i], numeric, atol + rtol * std::abs(numeric))
          << "input " << j << " element " << i << " of shape " << shape_str(x.shape());
    }
  }
}

// Runs fn on f64 inputs and on the same values in f32; the f32 output and gradients must be
// within `tol` relative error of the f64 ones.
inline void expect_f32_matches_f64(const OpFn& fn, const std::vector<Tensor>& inputs64,
                                   double tol = 1e-5, uint64_t seed = 99) {
  std::vector<Tensor> inputs32;
  for (const Tensor& t : inputs64) {
    Tensor c = is_floating(t.dtype()) ? t.detach().to(DType::kF32) : t;
    if (t.requires_grad()) c.set_requires_grad(true);
    inputs32.push_back(c);
  }
  for (const Tensor& t : inputs64) {
    if (t.requires_grad()) const_cast<Tensor&>(t).zero_grad();
  }
  Tensor out64 = fn(inputs64);
  Tensor out32 = fn(inputs32);
  ASSERT_EQ(out32.dtype(), DType::kF32);
  EXPECT_LT(rel_error(out32, out64), tol) << "forward";
  Generator gen(seed);
  Tensor w = randn(out64.shape(), gen, DType::kF64);
  autograd::backward(weighted_sum(out64, w));
  autograd::backward(weighted_sum(out32, w));
  for (size_t j = 0; j < inputs64.size(); ++j) {
    if (!inputs64[j].requires_grad()) continue;
    EXPECT_LT(rel_error(inputs32[j].grad(), inputs64[j].grad()), tol) << "gradient of input " << j;
  }
}

}  // namespace loom::testing
