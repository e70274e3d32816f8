// parallel/diloco/quantize.h — block-wise symmetric quantisation of DiLoCo's outer gradients
// (int8 or int4) for the exchange between islands, and error feedback across outer steps. Pure
// host arithmetic on caller-owned buffers; nothing here communicates.
//
// Note [Quantised outer gradients]: the outer gradient crosses the slow links between islands
// once per round, so its bytes are what DiLoCo pays for; Streaming DiLoCo (Douillard et al.
// 2025, arXiv 2501.18512) sends it in 4 bits, INTELLECT-1 (Prime Intellect 2024) in int8. Each
// block of `block` consecutive elements has one f32 scale, scale = absmax/qmax (qmax 127 for 8
// bits, 7 for 4), and codes round(x/scale) (half away from zero, clamped to ±qmax), so every
// element is within scale/2 of its value (up to f32 rounding). The caller
// chooses the block: a fixed size (64, 128, …) bounds the error by the block's largest value;
// row scaling is a block of the parameter's last-dimension length. Rounding alone loses what is
// below scale/2 every round, however often it recurs; error feedback (Note [Error feedback])
// carries it over to the next round instead.
//
// Payload of n elements: ceil(n/block) f32 scales (raw bytes, host endianness), then the codes:
// 8 bits, one int8 per element; 4 bits, two 4-bit two's-complement codes per byte, the first
// element in the low nibble (ceil(n/2) bytes, the last high nibble 0 when n is odd).
#pragma once

#include <cstdint>
#include <vector>

namespace loom::parallel::diloco {

// The payload size in bytes of n elements in blocks of `block` (>= 1); bits is 8 or 4.
int64_t quantized_bytes(int64_t n, int64_t block, int bits);

// x (n) → out (quantized_bytes(n, block, bits)). x must be finite. A block whose scale is 0 (all
// zeros, or so small that absmax/qmax underflows f32) gets scale 0 and codes 0.
void quantize(const float* x, int64_t n, int64_t block, int bits, uint8_t* out);
// in (quantized_bytes(n, block, bits)) → out (n): code·scale rounded to f32 (once: the product
// is exact in double).
void dequantize(const uint8_t* in, int64_t n, int64_t block, int bits, float* out);
// acc (n) += code·scale: summing the islands' payloads without a temporary.
void dequantize_add(const uint8_t* in, int64_t n, int64_t block, int bits, float* acc);

// Note [Error feedback]: what quantisation drops is kept in a residual r and added to the next
// input: y = x + r, send q(y), r ← y − dq(q(y)). Then Σ_t sent_t = Σ_t x_t − r_T exactly (up to
// f32 rounding), and |r_T| ≤ scale/2 per element: the sum of what was sent stays within one
// quantisation error of the sum of the inputs, however many rounds pass, where plain rounding
// drifts without bound (a small constant input that rounds to 0 is never sent at all).
class ErrorFeedback {
 public:
  // The residual of a vector of `total` elements, zeros.
  explicit ErrorFeedback(int64_t total);

  // Quantises x (n) + residual[offset, offset+n) into out (quantized_bytes(n, block, bits)) and
  // updates that range of the residual. Consecutive segments of one vector may be compressed by
  // separate calls, each with its own block size and bits. A throw (a non-finite x + residual)
  // leaves the residual unchanged.
  void compress(const float* x, int64_t offset, int64_t n, int64_t block, int bits, uint8_t* out);

  // The residual (total), state to checkpoint.
  std::vector<float>& residual() { return residual_; }
  const std::vector<float>& residual() const { return residual_; }

 private:
  std::vector<float> residual_;
};

}  // namespace loom::parallel::diloco
