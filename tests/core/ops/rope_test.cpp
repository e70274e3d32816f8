// tests/core/ops/rope_test.cpp — rope: values against a loop reference, identity at position 0,
// pair norms preserved, and non-contiguous global positions (a context-parallel rank's slice).
// Gradients at these shapes (finite differences in f64, f32 against f64, other backends) are
// the conformance table's rope cases (tests/conformance/cases/rope.cpp).
#include "core/ops/rope.h"

#include <cmath>

#include "core/ops/view.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::expect_gradcheck;
using testing::random;

Tensor arange_positions(int64_t t, DType dtype = DType::kI64) {
  std::vector<int64_t> v(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) v[i] = i;
  return Tensor::from_vector(v, {t}).to(dtype);
}

// Loop reference (rotate-half pairing), everything in double. x (B,T,H,D), pos (T).
std::vector<double> rope_reference(const Tensor& x, const std::vector<double>& pos, double theta) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
  const std::vector<double> xv = x.to_vector();
  std::vector<double> y(xv.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double a = pos[t] / std::pow(theta, 2.0 * i / D);
          const int64_t base = ((b * T + t) * H + h) * D;
          const double x1 = xv[base + i], x2 = xv[base + i + half];
          y[base + i] = x1 * std::cos(a) - x2 * std::sin(a);
          y[base + i + half] = x2 * std::cos(a) + x1 * std::sin(a);
        }
  return y;
}

struct RopeCase {
  Shape x;
  DType pos_dtype;
};

class RopeTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeTest, ValuesMatchReferenceLoop) {
  Generator gen(11);
  const RopeCase c = GetParam();
  Tensor x = random(c.x, gen, DType::kF64, false);
  Tensor pos = arange_positions(c.x[1], c.pos_dtype);
  std::vector<double> pv;
  for (double p : pos.to_vector()) pv.push_back(p);
  EXPECT_LT(testing::rel_error(ops::rope(x, pos, 500.0).to_vector(), rope_reference(x, pv, 500.0)),
            1e-14);
}

// A model's own frequencies and scale (layers/rope_scaling.h): values against the loop with
// the same angles and scale, and the gradient by finite differences in f64.
TEST(Rope, GivenFrequenciesAndScale) {
  Generator gen(5);
  const Tensor x = random({2, 5, 3, 8}, gen, DType::kF64, false);
  const Tensor pos = arange_positions(5);
  kernels::RopeFrequencies f = kernels::RopeFrequencies::plain(500.0, 8);
  f.inv_freq[1] /= 8;
  f.inv_freq[3] *= 0.3;
  f.scale = 1.3;
  const std::vector<double> xv = x.to_vector();
  std::vector<double> want(xv.size());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t i = 0; i < 4; ++i) {
          const double a = static_cast<double>(t) * f.inv_freq[static_cast<size_t>(i)];
          const int64_t base = ((b * 5 + t) * 3 + h) * 8;
          const double x1 = xv[base + i], x2 = xv[base + i + 4];
          want[base + i] = 1.3 * (x1 * std::cos(a) - x2 * std::sin(a));
          want[base + i + 4] = 1.3 * (x2 * std::cos(a) + x1 * std::sin(a));
        }
  EXPECT_LT(testing::rel_error(ops::rope(x, pos, f).to_vector(), want), 1e-14);
  expect_gradcheck([pos, f](const std::vector<Tensor>& in) { return ops::rope(in[0], pos, f); },
                   {random({1, 5, 2, 8}, gen, DType::kF64, true)});
  kernels::RopeFrequencies short_f = f;
  short_f.inv_freq.pop_back();
  EXPECT_THROW(ops::rope(x, pos, short_f), Error);  // D/2 frequencies or none
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeTest,
                         ::testing::Values(RopeCase{{1, 1, 1, 2}, DType::kI64},
                                           RopeCase{{2, 3, 2, 6}, DType::kI32},
                                           RopeCase{{1, 17, 3, 8}, DType::kI64},
                                           RopeCase{{2, 17, 1, 64}, DType::kI32}));

TEST(Rope, PositionZeroIsIdentity) {
  Generator gen(12);
  Tensor x = random({2, 3, 2, 8}, gen, DType::kF32, false);
  Tensor y = ops::rope(x, Tensor::zeros({3}, DType::kI64));
  EXPECT_EQ(y.to_vector(), x.to_vector());
}

TEST(Rope, PreservesPairNorms) {
  Generator gen(13);
  Tensor x = random({2, 17, 3, 10}, gen, DType::kF64, false);
  Tensor y = ops::rope(x, arange_positions(17), 10000.0);
  const auto xv = x.to_vector(), yv = y.to_vector();
  for (size_t base = 0; base < xv.size(); base += 10) {
    for (size_t i = 0; i < 5; ++i) {
      const double nx = std::hypot(xv[base + i], xv[base + i + 5]);
      const double ny = std::hypot(yv[base + i], yv[base + i + 5]);
      EXPECT_NEAR(ny, nx, 1e-12 * (1 + nx));
    }
  }
}

// A rank holding global positions {5, 9, 13, 100} (a strided view) gets the rows a single
// process computes for the whole sequence at those positions.
TEST(Rope, NonContiguousGlobalPositions) {
  Generator gen(14);
  const int64_t total = 101, H = 2, D = 8;
  Tensor full = random({1, total, H, D}, gen, DType::kF64, false);
  const std::vector<int64_t> picked{5, 9, 13, 100};
  std::vector<int64_t> interleaved;
  for (int64_t p : picked) interleaved.insert(interleaved.end(), {p, -1});
  Tensor base = Tensor::from_vector(interleaved, {8});
  Tensor pos = make_view(base, {4}, {2}, 0);
  ASSERT_FALSE(pos.is_contiguous());
  std::vector<Tensor> rows;
  for (int64_t p : picked) rows.push_back(ops::narrow(full, 1, p, 1));
  Tensor x = ops::cat(rows, 1);
  x.set_requires_grad(true);
  Tensor y = ops::rope(x, pos, 10000.0);
  Tensor y_full = ops::rope(full, arange_positions(total), 10000.0);
  for (size_t r = 0; r < picked.size(); ++r) {
    EXPECT_EQ(ops::narrow(y, 1, static_cast<int64_t>(r), 1).to_vector(),
              ops::narrow(y_full, 1, picked[r], 1).to_vector());
  }
  expect_gradcheck([pos](const std::vector<Tensor>& in) { return ops::rope(in[0], pos, 10000.0); },
                   {x});
}

TEST(Rope, RejectsBadInput) {
  EXPECT_THROW(ops::rope(Tensor::zeros({1, 2, 1, 3}), arange_positions(2)), Error);  // odd D
  EXPECT_THROW(ops::rope(Tensor::zeros({1, 2, 1, 4}), Tensor::zeros({2})), Error);   // float pos
  EXPECT_THROW(ops::rope(Tensor::zeros({1, 2, 1, 4}), arange_positions(3)), Error);  // wrong T
}

}  // namespace
}  // namespace loom
