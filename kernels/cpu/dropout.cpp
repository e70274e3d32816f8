// kernels/cpu/dropout.cpp — CPU dropout forward/backward, the mask regenerated from Philox per
// Note [Dropout mask] in kernels/dropout.h (element i's fate depends on (seed, offset, i) only).
// Uniforms are drawn one Philox block (4 lanes) at a time into a small stack buffer, then applied.
#include <bit>
#include <type_traits>

#include "core/philox.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/dropout.h"

namespace loom::kernels::cpu {
namespace {

// Elements per uniform buffer; a multiple of 4, so buffers start on a Philox block boundary.
constexpr int64_t kDropBuffer = 1024;
static_assert(kElementGrain % 4 == 0 && kDropBuffer % 4 == 0, "chunks must align to Philox blocks");

// u (count rounded up to 4): u[j] = uniform of element begin + j; begin is a multiple of 4.
inline void draw_uniforms(uint64_t seed, uint64_t offset, int64_t begin, int64_t count, float* u) {
  const int64_t blocks = (count + 3) / 4;
  const uint64_t first = offset + static_cast<uint64_t>(begin) / 4;
LOOM_SIMD
  for (int64_t b = 0; b < blocks; ++b) {
    const Philox4 r = philox4x32(first + static_cast<uint64_t>(b), seed);
    u[4 * b + 0] = uint_to_unit_float(r.v[0]);
    u[4 * b + 1] = uint_to_unit_float(r.v[1]);
    u[4 * b + 2] = uint_to_unit_float(r.v[2]);
    u[4 * b + 3] = uint_to_unit_float(r.v[3]);
  }
}

// v where the element is kept (u > pf), else +0; branch-free so the loop vectorises.
template <typename T>
[[gnu::always_inline]] inline T keep_or_zero(float u, float pf, T v) {
  using U = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
  return std::bit_cast<T>(std::bit_cast<U>(v) & vec_detail::mask<U>(u > pf));
}

// out[i] (=, or += when Accumulate) keep(i) ? in[i]·scale : 0.  in, out (n)
template <bool Accumulate, typename T>
void apply_mask(const T* in, T* out, int64_t n, double p, uint64_t seed, uint64_t offset) {
  const float pf = static_cast<float>(p);
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  parallel_for(n, kElementGrain, [&](int64_t lo, int64_t hi) {
    float u[kDropBuffer];
    for (int64_t s = lo; s < hi; s += kDropBuffer) {
      const int64_t e = std::min(hi, s + kDropBuffer);
      draw_uniforms(seed, offset, s, e - s, u);
      if constexpr (Accumulate) {
LOOM_SIMD
        for (int64_t i = s; i < e; ++i) out[i] += keep_or_zero(u[i - s], pf, in[i] * scale);
      } else {
LOOM_SIMD
        for (int64_t i = s; i < e; ++i) out[i] = keep_or_zero(u[i - s], pf, in[i] * scale);
      }
    }
  });
}

void dropout_forward_cpu(const Tensor& x, double p, uint64_t seed, uint64_t offset, Tensor& y) {
  LOOM_DISPATCH_FLOAT(x.dtype(), "dropout_forward", [&] {
    apply_mask<false>(x.data<scalar_t>(), y.data<scalar_t>(), x.numel(), p, seed, offset);
  });
}

void dropout_backward_cpu(const Tensor& dy, double p, uint64_t seed, uint64_t offset, Tensor& dx) {
  LOOM_DISPATCH_FLOAT(dy.dtype(), "dropout_backward", [&] {
    apply_mask<true>(dy.data<scalar_t>(), dx.data<scalar_t>(), dy.numel(), p, seed, offset);
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(dropout_forward, kCpu, dropout_forward_cpu);
LOOM_REGISTER_KERNEL(dropout_backward, kCpu, dropout_backward_cpu);

}  // namespace loom::kernels::cpu
