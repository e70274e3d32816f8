// parallel/diloco/quantize.cpp — block-wise int8/int4 quantisation and error feedback (Note
// [Quantised outer gradients] and Note [Error feedback] in parallel/diloco/quantize.h). Blocks
// and bytes are independent, so the payload does not depend on the number of threads; nothing
// throws inside a parallel region (failures are gathered and checked after it).
#include "parallel/diloco/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace loom::parallel::diloco {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // below this many elements, one thread

void check_args(const char* what, int64_t n, int64_t block, int bits) {
  LOOM_CHECK(bits == 8 || bits == 4, what, ": bits must be 8 or 4, got ", bits);
  LOOM_CHECK(n >= 0, what, ": n must be >= 0, got ", n);
  LOOM_CHECK(block >= 1, what, ": block must be >= 1, got ", block);
}

int64_t blocks_of(int64_t n, int64_t block) { return (n + block - 1) / block; }

// Code i of a payload's code section.
inline int load_code(const uint8_t* codes, int64_t i, int bits) {
  if (bits == 8) return static_cast<int8_t>(codes[i]);
  const int nibble = (codes[i >> 1] >> ((i & 1) * 4)) & 0xF;
  return nibble >= 8 ? nibble - 16 : nibble;
}

// f(i, code_i · scale_i) for every element of a payload. The product is exact in double (a 4- or
// 8-bit code times a 24-bit significand) and rounded to f32 once, so no FMA contraction of a
// caller's a·b + c can change it: every machine decodes the same bits.
template <typename F>
void for_each_value(const uint8_t* in, int64_t n, int64_t block, int bits, F f) {
  const int64_t nb = blocks_of(n, block);
  const uint8_t* codes = in + 4 * nb;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < nb; ++b) {
    float scale;
    std::memcpy(&scale, in + 4 * b, sizeof scale);
    const int64_t end = std::min(n, (b + 1) * block);
    for (int64_t i = b * block; i < end; ++i) {
      f(i, static_cast<float>(load_code(codes, i, bits) * static_cast<double>(scale)));
    }
  }
}

}  // namespace

int64_t quantized_bytes(int64_t n, int64_t block, int bits) {
  check_args("quantized_bytes", n, block, bits);
  return 4 * blocks_of(n, block) + (bits == 8 ? n : (n + 1) / 2);
}

void quantize(const float* x, int64_t n, int64_t block, int bits, uint8_t* out) {
  check_args("quantize", n, block, bits);
  const int64_t nb = blocks_of(n, block);
  const float qmax = bits == 8 ? 127.0f : 7.0f;
  // Pass 1: the scales, one per block (the first non-finite block is reported after the loop).
  std::vector<float> scales(static_cast<size_t>(nb));
  int64_t bad = nb;
#pragma omp parallel for schedule(static) reduction(min : bad) if (n >= kParallelMin)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t end = std::min(n, (b + 1) * block);
    float absmax = 0.0f;
    bool finite = true;
    for (int64_t i = b * block; i < end; ++i) {
      finite = finite && std::isfinite(x[i]);
      absmax = std::max(absmax, std::fabs(x[i]));
    }
    if (!finite) bad = std::min(bad, b);
    scales[b] = absmax / qmax;
  }
  LOOM_CHECK(bad == nb, "quantize: non-finite value in block ", bad, " (elements ", bad * block,
             "..", std::min(n, (bad + 1) * block) - 1, ")");
  std::memcpy(out, scales.data(), scales.size() * sizeof(float));
  // Pass 2: the codes, by output byte (two int4 codes of one byte may lie in two blocks).
  const double q = qmax;
  auto code_of = [&](int64_t i) -> int {
    const float s = scales[i / block];
    if (s == 0.0f) return 0;
    const double c = std::round(static_cast<double>(x[i]) / static_cast<double>(s));
    return static_cast<int>(std::clamp(c, -q, q));
  };
  uint8_t* codes = out + 4 * nb;
  if (bits == 8) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(code_of(i));
  } else {
    const int64_t bytes = (n + 1) / 2;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t j = 0; j < bytes; ++j) {
      const int lo = code_of(2 * j), hi = 2 * j + 1 < n ? code_of(2 * j + 1) : 0;
      codes[j] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
    }
  }
}

void dequantize(const uint8_t* in, int64_t n, int64_t block, int bits, float* out) {
  check_args("dequantize", n, block, bits);
  for_each_value(in, n, block, bits, [out](int64_t i, float v) { out[i] = v; });
}

void dequantize_add(const uint8_t* in, int64_t n, int64_t block, int bits, float* acc) {
  check_args("dequantize_add", n, block, bits);
  for_each_value(in, n, block, bits, [acc](int64_t i, float v) { acc[i] += v; });
}

ErrorFeedback::ErrorFeedback(int64_t total) {
  LOOM_CHECK(total >= 0, "error feedback: size must be >= 0, got ", total);
  residual_.assign(static_cast<size_t>(total), 0.0f);
}

void ErrorFeedback::compress(const float* x, int64_t offset, int64_t n, int64_t block, int bits,
                             uint8_t* out) {
  check_args("error feedback", n, block, bits);
  const int64_t total = static_cast<int64_t>(residual_.size());
  LOOM_CHECK(offset >= 0 && offset <= total - n, "error feedback: segment [", offset, ", ",
             offset + n, ") outside the residual of ", total, " elements");
  float* r = residual_.data() + offset;
  std::vector<float> y(static_cast<size_t>(n));  // apart from r, which a throw leaves unchanged
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] + r[i];
  quantize(y.data(), n, block, bits, out);
  for_each_value(out, n, block, bits, [r, &y](int64_t i, float v) { r[i] = y[i] - v; });
}

}  // namespace loom::parallel::diloco
