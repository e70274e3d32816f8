// tests/parallel/diloco/quantize_test.cpp — int8/int4 block quantisation of outer gradients
// (parallel/diloco/quantize.h) against a plain reference (payload bytes and values, odd sizes,
// short last blocks, block 1, zero blocks), hand-made payloads (nibble order, rounding half away
// from zero), the scale/2 error bound, payload sizes, and error feedback's bounded sum.
#include "parallel/diloco/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"

namespace loom::parallel::diloco {
namespace {

using Bytes = std::vector<uint8_t>;

// The reference: scales and codes element by element, then packed.
Bytes ref_quantize(const std::vector<float>& x, int64_t block, int bits) {
  const int qmax = bits == 8 ? 127 : 7;
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> scales;
  std::vector<int> codes;
  for (int64_t start = 0; start < n; start += block) {
    const int64_t end = std::min(n, start + block);
    float absmax = 0;
    for (int64_t i = start; i < end; ++i) absmax = std::max(absmax, std::fabs(x[i]));
    const float s = absmax / static_cast<float>(qmax);
    scales.push_back(s);
    for (int64_t i = start; i < end; ++i) {
      int c = 0;
      if (s != 0) {
        const double r = static_cast<double>(x[i]) / s;  // half away from zero:
        c = r >= 0 ? static_cast<int>(std::floor(r + 0.5)) : -static_cast<int>(std::floor(0.5 - r));
      }
      codes.push_back(std::clamp(c, -qmax, qmax));
    }
  }
  Bytes out(scales.size() * 4 + (bits == 8 ? n : (n + 1) / 2), 0);
  std::memcpy(out.data(), scales.data(), scales.size() * 4);
  uint8_t* packed = out.data() + scales.size() * 4;
  for (int64_t i = 0; i < n; ++i) {
    if (bits == 8) {
      packed[i] = static_cast<uint8_t>(static_cast<int8_t>(codes[i]));
    } else {
      packed[i / 2] |= static_cast<uint8_t>((codes[i] & 0xF) << (4 * (i % 2)));
    }
  }
  return out;
}

float scale_at(const Bytes& p, int64_t b) {
  float s;
  std::memcpy(&s, p.data() + 4 * b, 4);
  return s;
}

// Normal values whose spread changes from block to block, with zeros: every 5th element and,
// when there are three blocks or more, the whole second block.
std::vector<float> test_data(std::mt19937& rng, int64_t n, int64_t block) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i)
    x[i] = i % 5 == 3 ? 0.0f : d(rng) * std::exp2(float(i / block % 7) - 3);
  if (n >= 3 * block) std::fill(x.begin() + block, x.begin() + 2 * block, 0.0f);
  return x;
}

Bytes quantized(const std::vector<float>& x, int64_t block, int bits) {
  const int64_t n = static_cast<int64_t>(x.size());
  Bytes p(quantized_bytes(n, block, bits));
  quantize(x.data(), n, block, bits, p.data());
  return p;
}

TEST(DilocoQuantize, MatchesReference) {
  std::mt19937 rng(1);
  for (int bits : {8, 4}) {
    for (int64_t n : {1, 2, 7, 64, 100, 1001, 100003}) {
      for (int64_t block : {1, 3, 64, 128, 5000}) {
        SCOPED_TRACE(::testing::Message() << "bits " << bits << " n " << n << " block " << block);
        const std::vector<float> x = test_data(rng, n, block);
        const Bytes p = quantized(x, block, bits);
        ASSERT_EQ(p, ref_quantize(x, block, bits));
        std::vector<float> y(n), acc(n), want_acc(n);
        dequantize(p.data(), n, block, bits, y.data());
        for (int64_t i = 0; i < n; ++i) acc[i] = want_acc[i] = 0.5f * x[(i * 7) % n];
        dequantize_add(p.data(), n, block, bits, acc.data());
        const uint8_t* codes = p.data() + 4 * ((n + block - 1) / block);
        for (int64_t i = 0; i < n; ++i) {
          const int c = bits == 8 ? int(int8_t(codes[i]))
                                  : (int((codes[i / 2] >> (4 * (i % 2))) & 0xF) ^ 8) - 8;
          const float s = scale_at(p, i / block), v = float(double(c) * s);
          ASSERT_EQ(y[i], v) << i;
          ASSERT_EQ(acc[i], want_acc[i] + v) << i;
          // the error bound: scale/2, up to the f32 rounding of code·scale
          ASSERT_LE(std::fabs(x[i] - y[i]), 0.5 * s * (1 + 1e-6) + std::fabs(x[i]) * 0x1p-23) << i;
          if (x[i] == 0) {
            ASSERT_EQ(c, 0) << i;
          }
        }
      }
    }
  }
}

Bytes with_scales(std::initializer_list<float> scales, std::initializer_list<uint8_t> codes) {
  Bytes out(scales.size() * 4);
  std::memcpy(out.data(), std::data(scales), out.size());
  out.insert(out.end(), codes);
  return out;
}

TEST(DilocoQuantize, Int4PackingByHand) {
  // block 0: absmax 7, scale 1: codes 7, 4 (3.5 rounds away from zero), -4;
  // block 1: absmax 14, scale 2: codes 7, -2 (-1.5 → -2), 0. Low nibble first.
  const std::vector<float> x = {7, 3.5f, -3.5f, 14, -3, 0};
  EXPECT_EQ(quantized(x, 3, 4), with_scales({1.0f, 2.0f}, {0x47, 0x7C, 0x0E}));
  // odd n: the last byte's high nibble is 0; 5/2 = 2.5 rounds to 3 (away from zero, not to even)
  const std::vector<float> odd = {7, 3.5f, -3.5f, 14, 5};
  EXPECT_EQ(quantized(odd, 3, 4), with_scales({1.0f, 2.0f}, {0x47, 0x7C, 0x03}));
  std::vector<float> y(5);
  const Bytes p = quantized(odd, 3, 4);
  dequantize(p.data(), 5, 3, 4, y.data());
  EXPECT_EQ(y, (std::vector<float>{7, 4, -4, 14, 6}));
  // one block of everything: scale 2, codes 4 (3.5/2 = 1.75 → 2), 2, -2, 7, -2 (−1.5), 0
  EXPECT_EQ(quantized(x, 6, 4), with_scales({2.0f}, {0x24, 0x7E, 0x0E}));
}

TEST(DilocoQuantize, Int8ByHand) {
  const std::vector<float> x = {127, -63.5f, 0.4f, 0, -0.5f};
  EXPECT_EQ(quantized(x, 5, 8), with_scales({1.0f}, {0x7F, 0xC0, 0x00, 0x00, 0xFF}));
  const std::vector<float> zeros = {0, 0, 0, 254};  // an all-zero block: scale 0, codes 0
  EXPECT_EQ(quantized(zeros, 3, 8), with_scales({0.0f, 2.0f}, {0, 0, 0, 127}));
}

TEST(DilocoQuantize, PayloadSizeAndChecks) {
  EXPECT_EQ(quantized_bytes(0, 4, 8), 0);
  EXPECT_EQ(quantized_bytes(1, 64, 8), 5);
  EXPECT_EQ(quantized_bytes(1, 64, 4), 5);
  EXPECT_EQ(quantized_bytes(5, 5, 4), 7);
  EXPECT_EQ(quantized_bytes(6, 3, 4), 11);
  EXPECT_EQ(quantized_bytes(130, 64, 8), 142);
  EXPECT_EQ(quantized_bytes(130, 64, 4), 77);
  EXPECT_EQ(quantized_bytes(7, 1, 4), 32);
  EXPECT_THROW(quantized_bytes(8, 4, 2), Error);
  EXPECT_THROW(quantized_bytes(8, 4, 16), Error);
  EXPECT_THROW(quantized_bytes(8, 0, 8), Error);
  EXPECT_THROW(quantized_bytes(-1, 4, 8), Error);
  std::vector<float> x = {1, 2, NAN, 4};
  Bytes p(quantized_bytes(4, 2, 8));
  EXPECT_THROW(quantize(x.data(), 4, 2, 8, p.data()), Error);
  x[2] = INFINITY;
  EXPECT_THROW(quantize(x.data(), 4, 2, 4, p.data()), Error);
}

// Sends x_t for 50 steps, with or without error feedback; returns the largest |Σ sent − Σ x|
// over elements and steps, checking with feedback that it stays within half the current scale.
double drift(const std::vector<std::vector<float>>& xs, int64_t block, int bits, bool feedback) {
  const int64_t n = static_cast<int64_t>(xs[0].size());
  ErrorFeedback ef(n);
  std::vector<double> sum_x(n, 0.0), sum_q(n, 0.0);
  Bytes p(quantized_bytes(n, block, bits));
  std::vector<float> q(n);
  double worst = 0;
  for (const std::vector<float>& x : xs) {
    if (feedback) {
      ef.compress(x.data(), 0, n, block, bits, p.data());
    } else {
      quantize(x.data(), n, block, bits, p.data());
    }
    dequantize(p.data(), n, block, bits, q.data());
    for (int64_t i = 0; i < n; ++i) {
      sum_x[i] += x[i];
      sum_q[i] += q[i];
      const double d = std::fabs(sum_q[i] - sum_x[i]);
      worst = std::max(worst, d);
      if (feedback) {  // Σ x − Σ sent is the residual, within half a scale (f32 rounding aside)
        EXPECT_NEAR(sum_x[i] - sum_q[i], ef.residual()[i], 1e-4);
        EXPECT_LE(d, 0.5 * scale_at(p, i / block) + 1e-4) << i;
      }
    }
  }
  return worst;
}

TEST(DilocoErrorFeedback, SumStaysWithinOneQuantisationError) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int bits : {8, 4}) {
    std::vector<std::vector<float>> xs(50, std::vector<float>(301));
    for (auto& x : xs) std::generate(x.begin(), x.end(), [&] { return d(rng); });
    const double with = drift(xs, 64, bits, true), without = drift(xs, 64, bits, false);
    const double scale = 5.0 / (bits == 8 ? 127 : 7);  // above the largest scale of a block
    EXPECT_LT(with, 0.5 * scale) << bits;
    EXPECT_GT(without, 2 * with) << bits;
  }
}

TEST(DilocoErrorFeedback, SmallConstantInputIsSentEventually) {
  // 0.01 next to 1.0 in an int4 block (scale 1/7): it rounds to 0 on its own, every time
  std::vector<float> x(8, 0.01f);
  x[0] = 1.0f;
  const std::vector<std::vector<float>> xs(50, x);
  EXPECT_NEAR(drift(xs, 8, 4, false), 0.5, 1e-5);  // Σ x = 0.5, nothing sent
  EXPECT_LE(drift(xs, 8, 4, true), 0.5 / 7 + 1e-4);
}

TEST(DilocoErrorFeedback, SegmentsAndRestore) {
  std::mt19937 rng(4);
  std::normal_distribution<float> d(0.0f, 1.0f);
  ErrorFeedback whole(200), a(120), b(80);
  for (int t = 0; t < 5; ++t) {
    std::vector<float> x(200);
    std::generate(x.begin(), x.end(), [&] { return d(rng); });
    Bytes pa(quantized_bytes(120, 40, 8)), pb(quantized_bytes(80, 16, 4));
    Bytes wa(pa.size()), wb(pb.size());
    a.compress(x.data(), 0, 120, 40, 8, pa.data());
    b.compress(x.data() + 120, 0, 80, 16, 4, pb.data());
    whole.compress(x.data() + 120, 120, 80, 16, 4, wb.data());  // either order
    whole.compress(x.data(), 0, 120, 40, 8, wa.data());
    ASSERT_EQ(wa, pa);
    ASSERT_EQ(wb, pb);
  }
  std::vector<float> joined = a.residual();
  joined.insert(joined.end(), b.residual().begin(), b.residual().end());
  EXPECT_EQ(whole.residual(), joined);
  EXPECT_NE(whole.residual(), std::vector<float>(200, 0.0f));
  // restored from its residual, a fresh one sends the same bytes
  ErrorFeedback restored(200);
  restored.residual() = whole.residual();
  std::vector<float> x(200, 0.25f);
  Bytes p1(quantized_bytes(200, 64, 4)), p2(p1.size());
  whole.compress(x.data(), 0, 200, 64, 4, p1.data());
  restored.compress(x.data(), 0, 200, 64, 4, p2.data());
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(whole.residual(), restored.residual());
  // out of range, and a non-finite input (which leaves the residual as it was)
  EXPECT_THROW(whole.compress(x.data(), 150, 80, 16, 4, p1.data()), Error);
  EXPECT_THROW(whole.compress(x.data(), -1, 10, 16, 4, p1.data()), Error);
  const std::vector<float> before = whole.residual();
  x[5] = NAN;
  EXPECT_THROW(whole.compress(x.data(), 0, 200, 64, 4, p1.data()), Error);
  EXPECT_EQ(whole.residual(), before);
}

}  // namespace
}  // namespace loom::parallel::diloco
