// kernels/cpu/vec_math.h — exp and the logistic sigmoid written with arithmetic and bit operations
// only, so loops that call them vectorise under `omp simd` with the default floating-point flags.
// (glibc declares its vector exp only under -ffast-math, so a call to std::exp keeps a loop
// scalar; with -ftrapping-math neither std::floor nor a select on a float compare vectorises,
// hence the rounding by a shift constant and the blends through integer masks below.)
// For CPU kernels only; nothing here has state.
//
// Note [Vectorisable exp]: exp(x) = 2^k · e^r with k = round(x·log2 e) and r = x − k·ln 2
// (ln 2 split in two for an exact product), |r| ≤ ln2/2; e^r is its Taylor polynomial (degree 13
// for f64, 7 for f32: truncation below half an ulp), and 2^k is built in the exponent bits as two
// factors (so k = 1024 resp. 128 fits). Within a few ulp of std::exp; +inf above the overflow
// threshold, 0 below the smallest normal result (no subnormals), NaN stays NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace loom::kernels::cpu {

namespace vec_detail {

// All-ones where `c`, else zero: a select that stays branch-free under -ftrapping-math.
template <typename U>
[[gnu::always_inline]] inline U mask(bool c) {
  return U(0) - static_cast<U>(c);
}

// The float whose bits are `base` where the mask is clear and `other` where it is set.
template <typename F, typename U>
[[gnu::always_inline]] inline F blend(F base, U other_bits, U m) {
  return std::bit_cast<F>((std::bit_cast<U>(base) & ~m) | (other_bits & m));
}

}  // namespace vec_detail

[[gnu::always_inline]] inline double vexp(double x) {
  using U = uint64_t;
  constexpr double kLog2e = 1.4426950408889634, kLn2Hi = 0.693147180369123816490;
  constexpr double kLn2Lo = 1.90821492927058770002e-10, kShift = 6755399441055744.0;  // 1.5·2^52
  constexpr double kHi = 709.782712893384, kLo = -708.3964185322641;
  const U over = vec_detail::mask<U>(x > kHi), under = vec_detail::mask<U>(x < kLo);
  const double xc = vec_detail::blend(vec_detail::blend(x, std::bit_cast<U>(kHi), over),
                                      std::bit_cast<U>(kLo), under);
  const double k = (xc * kLog2e + kShift) - kShift;        // round to nearest
  const double k1 = ((0.5 * k - 0.25) + kShift) - kShift;  // ⌊k/2⌋ (k integral)
  const double r = (xc - k * kLn2Hi) - k * kLn2Lo;
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^j for integral j: j + kShift holds j in its low mantissa bits (two's complement).
  const U kb = std::bit_cast<U>(k + kShift) - std::bit_cast<U>(kShift);
  const U k1b = std::bit_cast<U>(k1 + kShift) - std::bit_cast<U>(kShift);
  const double s1 = std::bit_cast<double>((k1b + 1023) << 52);
  const double s2 = std::bit_cast<double>((kb - k1b + 1023) << 52);
  double y = p * s1 * s2;
  y = vec_detail::blend(y, U{0x7ff0000000000000ull}, over);  // +inf
  y = vec_detail::blend(y, U{0}, under);
  return vec_detail::blend(y, std::bit_cast<U>(x), vec_detail::mask<U>(x != x));  // NaN
}

[[gnu::always_inline]] inline float vexp(float x) {
  using U = uint32_t;
  constexpr float kLog2e = 1.44269504f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kShift = 12582912.0f;  // 1.5·2^23
  constexpr float kHi = 88.7228317f, kLo = -87.3365479f;
  const U over = vec_detail::mask<U>(x > kHi), under = vec_detail::mask<U>(x < kLo);
  const float xc = vec_detail::blend(vec_detail::blend(x, std::bit_cast<U>(kHi), over),
                                     std::bit_cast<U>(kLo), under);
  const float k = (xc * kLog2e + kShift) - kShift;
  const float k1 = ((0.5f * k - 0.25f) + kShift) - kShift;
  const float r = (xc - k * kLn2Hi) - k * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const U kb = std::bit_cast<U>(k + kShift) - std::bit_cast<U>(kShift);
  const U k1b = std::bit_cast<U>(k1 + kShift) - std::bit_cast<U>(kShift);
  const float s1 = std::bit_cast<float>((k1b + 127) << 23);
  const float s2 = std::bit_cast<float>((kb - k1b + 127) << 23);
  float y = p * s1 * s2;
  y = vec_detail::blend(y, U{0x7f800000u}, over);
  y = vec_detail::blend(y, U{0}, under);
  return vec_detail::blend(y, std::bit_cast<U>(x), vec_detail::mask<U>(x != x));
}

// 1 / (1 + e^−x), in [0, 1]; exactly 0 and 1 in the far tails.
template <typename T>
[[gnu::always_inline]] inline T vsigmoid(T x) {
  return T(1) / (T(1) + vexp(-x));
}

}  // namespace loom::kernels::cpu
