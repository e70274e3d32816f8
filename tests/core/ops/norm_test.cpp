// tests/core/ops/norm_test.cpp — layer_norm (with and without bias), rms_norm and
// residual_layer_norm: values against a reference loop (residual_layer_norm: against add then
// layer_norm), results independent of the thread count, shape errors. Gradients (finite
// differences in f64, f32 against f64, other backends) are the conformance table's cases
// (tests/conformance/cases/norm.cpp).
#include "core/ops/norm.h"

#include <omp.h>

#include <cmath>

#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::random;

TEST(Norm, LayerNormValuesMatchReferenceLoop) {
  Generator gen(23);
  const int64_t n = 7, c = 17;
  Tensor x = random({n, c}, gen, DType::kF64, false, 3.0);
  Tensor w = random({c}, gen, DType::kF64, false), b = random({c}, gen, DType::kF64, false);
  const double eps = 1e-5;
  Tensor y = ops::layer_norm(x, w, b, eps), y0 = ops::layer_norm(x, w, Tensor(), eps);
  for (int64_t i = 0; i < n; ++i) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < c; ++j) mu += x.at({i, j}) / c;
    for (int64_t j = 0; j < c; ++j) var += (x.at({i, j}) - mu) * (x.at({i, j}) - mu) / c;
    for (int64_t j = 0; j < c; ++j) {
      const double xh = (x.at({i, j}) - mu) / std::sqrt(var + eps);
      EXPECT_NEAR(y.at({i, j}), xh * w.at({j}) + b.at({j}), 1e-12);
      EXPECT_NEAR(y0.at({i, j}), xh * w.at({j}), 1e-12);
    }
  }
}

TEST(Norm, RmsNormValuesMatchReferenceLoop) {
  Generator gen(24);
  const int64_t n = 5, c = 65;
  Tensor x = random({n, c}, gen, DType::kF64, false, 2.0);
  Tensor w = random({c}, gen, DType::kF64, false);
  Tensor y = ops::rms_norm(x, w, 1e-6);
  for (int64_t i = 0; i < n; ++i) {
    double ms = 0;
    for (int64_t j = 0; j < c; ++j) ms += x.at({i, j}) * x.at({i, j}) / c;
    for (int64_t j = 0; j < c; ++j) {
      EXPECT_NEAR(y.at({i, j}), x.at({i, j}) / std::sqrt(ms + 1e-6) * w.at({j}), 1e-12);
    }
  }
}

TEST(Norm, ResidualLayerNormIsAddThenLayerNorm) {
  Generator gen(27);
  Tensor x = random({9, 33}, gen, DType::kF32, false, 2.0),
         r = random({9, 33}, gen, DType::kF32, false);
  Tensor w = random({33}, gen, DType::kF32, false), b = random({33}, gen, DType::kF32, false);
  const ops::ResidualLayerNorm out = ops::residual_layer_norm(x, r, w, b, 1e-6);
  const Tensor sum = ops::add(x, r);
  EXPECT_EQ(out.sum.to_vector(), sum.to_vector());
  EXPECT_EQ(out.normalized.to_vector(), ops::layer_norm(sum, w, b, 1e-6).to_vector());
  EXPECT_THROW(ops::residual_layer_norm(x, Tensor::zeros({9, 32}), w, b), Error);
}

// Forward output and all gradients of `fn` on f32 inputs, run with `threads` OpenMP threads.
std::vector<std::vector<double>> run_with_threads(int threads, const testing::OpFn& fn,
                                                  const std::vector<Tensor>& inputs) {
  const int prev = omp_get_max_threads();
  omp_set_num_threads(threads);
  for (const Tensor& t : inputs) const_cast<Tensor&>(t).zero_grad();
  Tensor y = fn(inputs);
  Generator gen(5);
  autograd::backward(testing::weighted_sum(y, randn(y.shape(), gen, DType::kF64)));
  omp_set_num_threads(prev);
  std::vector<std::vector<double>> out{y.to_vector()};
  for (const Tensor& t : inputs) out.push_back(t.grad().to_vector());
  return out;
}

TEST(Norm, ResultsDoNotDependOnThreadCount) {
  Generator gen(25);
  // 3000 rows: many row chunks for the weight gradients, several row tasks for dx.
  Tensor x = random({3000, 65}, gen, DType::kF32), w = random({65}, gen, DType::kF32);
  Tensor b = random({65}, gen, DType::kF32);
  auto ln = [](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], in[1], in[2]); };
  EXPECT_EQ(run_with_threads(1, ln, {x, w, b}), run_with_threads(2, ln, {x, w, b}));
  auto rms = [](const std::vector<Tensor>& in) { return ops::rms_norm(in[0], in[1]); };
  EXPECT_EQ(run_with_threads(1, rms, {x, w}), run_with_threads(2, rms, {x, w}));
}

TEST(Norm, BadParameterShapesAreNamed) {
  Tensor x = Tensor::zeros({4, 8}), w = Tensor::ones({7});
  try {
    ops::layer_norm(x, w, Tensor());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_norm: weight has shape (7), expected (8)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ops::rms_norm(x, Tensor::ones({8}, DType::kF64)), Error);
}

}  // namespace
}  // namespace loom
