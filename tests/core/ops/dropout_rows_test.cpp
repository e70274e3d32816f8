// tests/core/ops/dropout_rows_test.cpp — the rows form of dropout (Note [Dropout mask],
// kernels/dropout.h) used under sequence and context parallelism: with rows = 0..T−1 the rows
// kernels equal the plain kernels bit for bit; with a permuted subset of rows each element gets
// the fate (and value) of its element in the whole tensor, also for a batch offset (data
// parallelism); the op (ops::dropout_rows_at, at an explicit Philox stream) equals its slice of
// ops::dropout_at on the whole tensor, regenerates the mask in backward and passes a
// finite-difference gradient check.
#include <numeric>

#include "core/ops/dropout.h"
#include "core/ops/view.h"
#include "kernels/dropout.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::expect_gradcheck;
using testing::random;

struct Draw {
  double p;
  uint64_t seed, offset;
};
const Draw kDraws[] = {{0.1, 1234, 0}, {0.5, 99, 7}, {0.9, 0xdeadbeefcafeULL, 123457}, {1.0, 6, 1}};
// (B, T, C): C odd, a multiple of 4, and longer than one uniform buffer of the CPU kernel.
const Shape kShapes[] = {{1, 1, 1}, {2, 5, 7}, {3, 4, 8}, {2, 3, 1029}};

Tensor rows_of(const std::vector<int64_t>& r) {
  return Tensor::from_vector(r, {static_cast<int64_t>(r.size())});
}

std::vector<int64_t> iota_rows(int64_t t) {
  std::vector<int64_t> r(static_cast<size_t>(t));
  std::iota(r.begin(), r.end(), int64_t{0});
  return r;
}

// x (B, T, C) → its rows `rows` (B, R, C).
Tensor take_rows(const Tensor& x, const std::vector<int64_t>& rows) {
  std::vector<Tensor> parts;
  for (int64_t r : rows) parts.push_back(ops::narrow(x.detach(), 1, r, 1));
  return ops::contiguous(ops::cat(parts, 1));
}

TEST(DropoutRows, AllRowsEqualThePlainKernelBitForBit) {
  Generator gen(501);
  for (DType dt : {DType::kF32, DType::kF64}) {
    for (const Shape& s : kShapes) {
      for (const Draw& d : kDraws) {
        const Tensor x = random(s, gen, dt, false);
        const Tensor rows = rows_of(iota_rows(s[1]));
        Tensor want = Tensor::empty(s, dt), got = Tensor::empty(s, dt);
        kernels::call_kernel<kernels::dropout_forward_k>(x, d.p, d.seed, d.offset, want);
        kernels::call_kernel<kernels::dropout_rows_forward_k>(x, rows, s[1], 0, d.p, d.seed,
                                                              d.offset, got);
        EXPECT_EQ(got.to_vector(), want.to_vector()) << shape_str(s) << " p=" << d.p;
        // Backward accumulates into a random gradient with the same mask.
        const Tensor dy = random(s, gen, dt, false), dx = random(s, gen, dt, false);
        Tensor want_dx = dx.clone(), got_dx = dx.clone();
        kernels::call_kernel<kernels::dropout_backward_k>(dy, d.p, d.seed, d.offset, want_dx);
        kernels::call_kernel<kernels::dropout_rows_backward_k>(dy, rows, s[1], 0, d.p, d.seed,
                                                               d.offset, got_dx);
        EXPECT_EQ(got_dx.to_vector(), want_dx.to_vector()) << shape_str(s) << " p=" << d.p;
      }
    }
  }
}

TEST(DropoutRows, SubsetOfRowsGetsTheWholeTensorsMask) {
  Generator gen(502);
  for (DType dt : {DType::kF32, DType::kF64}) {
    for (const Shape& s : {Shape{2, 8, 7}, Shape{3, 6, 12}, Shape{2, 4, 1030}}) {
      const int64_t T = s[1];
      // A context-parallel rank's rows (chunk 1 and the mirrored chunk), out of order.
      const std::vector<int64_t> picks = {T - 1, 1, T / 2, 0};
      for (const Draw& d : kDraws) {
        const Tensor x = random(s, gen, dt, false);
        Tensor full = Tensor::empty(s, dt);
        kernels::call_kernel<kernels::dropout_forward_k>(x, d.p, d.seed, d.offset, full);
        const Tensor xs = take_rows(x, picks);
        Tensor got = Tensor::empty(xs.shape(), dt);
        kernels::call_kernel<kernels::dropout_rows_forward_k>(xs, rows_of(picks), T, 0, d.p, d.seed,
                                                              d.offset, got);
        EXPECT_EQ(got.to_vector(), take_rows(full, picks).to_vector())
            << shape_str(s) << " p=" << d.p;
        const Tensor dys = take_rows(random(s, gen, dt, false), picks);
        Tensor got_dx = Tensor::zeros(xs.shape(), dt);
        kernels::call_kernel<kernels::dropout_rows_backward_k>(dys, rows_of(picks), T, 0, d.p,
                                                               d.seed, d.offset, got_dx);
        // The plain mask of the whole tensor, applied to the picked rows of dy.
        Tensor dy_full = Tensor::zeros(s, dt);
        for (size_t j = 0; j < picks.size(); ++j) {
          Tensor dst = ops::narrow(dy_full, 1, picks[j], 1);
          ops::copy_(dst, ops::narrow(dys, 1, static_cast<int64_t>(j), 1));
        }
        Tensor dx_full = Tensor::zeros(s, dt);
        kernels::call_kernel<kernels::dropout_backward_k>(dy_full, d.p, d.seed, d.offset, dx_full);
        EXPECT_EQ(got_dx.to_vector(), take_rows(dx_full, picks).to_vector())
            << shape_str(s) << " p=" << d.p;
      }
    }
  }
}

TEST(DropoutRows, OpMatchesItsSliceOfTheWholeTensor) {
  Generator data(503);
  const Shape s{2, 8, 5};
  const Tensor x = random(s, data, DType::kF32, false);
  const uint64_t seed = 77, offset = 9;  // a non-zero offset
  const Tensor full = ops::dropout_at(x, 0.3, seed, offset, true);
  const std::vector<int64_t> picks = {2, 3, 4, 5};  // a sequence-parallel rank's chunk
  const Tensor rows = Tensor::from_vector(std::vector<int32_t>{2, 3, 4, 5}, {4});  // i32 accepted
  const Tensor y = ops::dropout_rows_at(take_rows(x, picks), 0.3, seed, offset, true, rows, 8);
  EXPECT_EQ(y.to_vector(), take_rows(full, picks).to_vector());
  // Another stream draws another mask.
  EXPECT_NE(
      ops::dropout_rows_at(take_rows(x, picks), 0.3, seed + 1, offset, true, rows, 8).to_vector(),
      y.to_vector());
}

// Data parallelism: a rank holding batch elements [b0, b0 + B) of the (B_total, T, C) batch
// (and, with sequence parallelism, some rows) draws the whole batch's mask for them.
TEST(DropoutRows, BatchOffsetGetsTheWholeBatchsMask) {
  Generator data(506);
  const Shape s{4, 6, 7};  // the whole batch
  const Tensor x = random(s, data, DType::kF32, false);
  const Tensor full = ops::dropout_at(x, 0.4, 78, 0, true);
  const std::vector<int64_t> picks = {3, 4, 5};
  for (int64_t b0 : {0, 1, 2}) {
    const Tensor part = ops::narrow(x, 0, b0, 2);
    const Tensor y =
        ops::dropout_rows_at(take_rows(part, picks), 0.4, 78, 0, true, rows_of(picks), 6, b0);
    EXPECT_EQ(y.to_vector(), take_rows(ops::narrow(full, 0, b0, 2), picks).to_vector())
        << "b0 " << b0;
  }
  EXPECT_THROW(ops::dropout_rows_at(take_rows(ops::narrow(x, 0, 2, 2), picks), 0.4, 78, 0, true,
                                    rows_of(picks), 6, -1),
               Error);  // a negative batch offset
}

TEST(DropoutRows, BackwardUsesTheForwardMask) {
  Generator gen(504);
  Tensor x = random({2, 3, 9}, gen, DType::kF32);
  Tensor y = ops::dropout_rows_at(x, 0.25, 504, 3, true, rows_of({4, 0, 2}), 5);
  autograd::backward(ops::sum(y));
  const auto yv = y.to_vector(), gv = x.grad().to_vector();
  const float scale = static_cast<float>(1.0 / 0.75);
  for (size_t i = 0; i < yv.size(); ++i) EXPECT_EQ(gv[i], yv[i] != 0.0 ? scale : 0.0f) << i;
}

TEST(DropoutRows, GradientsMatchFiniteDifferences) {
  Generator gen(505);
  for (const Shape& s : {Shape{1, 1, 1}, Shape{2, 3, 5}, Shape{1, 4, 17}}) {
    Tensor x = random(s, gen);
    std::vector<int64_t> picks(static_cast<size_t>(s[1]));
    for (int64_t j = 0; j < s[1]; ++j) picks[static_cast<size_t>(j)] = 2 * (s[1] - 1 - j) + 1;
    const Tensor rows = rows_of(picks);
    for (double p : {0.1, 0.5}) {
      auto fn = [p, rows, s](const std::vector<Tensor>& in) {
        return ops::dropout_rows_at(in[0], p, 1234, 0, true, rows, 2 * s[1]);
      };
      expect_gradcheck(fn, {x});
    }
  }
}

TEST(DropoutRows, IdentityWhenNotTrainingOrPZeroAndBadRowsRefused) {
  Generator data(506);
  const Tensor x = random({2, 3, 4}, data);
  const Tensor rows = rows_of({0, 1, 2});
  EXPECT_TRUE(ops::dropout_rows_at(x, 0.5, 7, 0, false, rows, 6).same(x));
  EXPECT_TRUE(ops::dropout_rows_at(x, 0.0, 7, 0, true, rows, 6).same(x));
  EXPECT_THROW(ops::dropout_rows_at(x, 0.5, 7, 0, true, rows_of({0, 1, 6}), 6), Error);  // ≥ T
  EXPECT_THROW(ops::dropout_rows_at(x, 0.5, 7, 0, true, rows_of({0, 1}), 6), Error);     // R ≠ 3
  EXPECT_THROW(ops::dropout_rows_at(x, 0.5, 7, 0, true, rows, 2), Error);                // T < R
}

}  // namespace
}  // namespace loom
