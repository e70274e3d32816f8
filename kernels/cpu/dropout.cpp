// kernels/cpu/dropout.cpp — CPU dropout forward/backward, the mask regenerated from Philox per
// Note [Dropout mask] in kernels/dropout.h (element i's fate depends on (seed, offset, i) only).
// Uniforms are drawn one Philox block (4 lanes) at a time into a small stack buffer, then applied.
// The rows form walks rows (b, j) of x (B, R, C), each a run of C consecutive elements of the
// full (B, T, C) tensor's mask, drawn from the Philox block that holds its first element.
#include "kernels/dropout.h"

#include <algorithm>
#include <bit>
#include <type_traits>

#include "core/philox.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

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

// dst[i] (=, or += when Accumulate) u[i] > pf ? src[i]·scale : 0 for i < n: one run of elements
// whose uniforms are drawn.
template <bool Accumulate, typename T>
[[gnu::always_inline]] inline void apply_run(const T* src, T* dst, const float* u, int64_t n,
                                             float pf, T scale) {
  if constexpr (Accumulate) {
    LOOM_SIMD
    for (int64_t i = 0; i < n; ++i) dst[i] += keep_or_zero(u[i], pf, src[i] * scale);
  } else {
    LOOM_SIMD
    for (int64_t i = 0; i < n; ++i) dst[i] = keep_or_zero(u[i], pf, src[i] * scale);
  }
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
      apply_run<Accumulate>(in + s, out + s, u, e - s, pf, scale);
    }
  });
}

// Rows form: out (B, R, C) (=, or += when Accumulate) keep(g + c) ? in·scale : 0 for row (b, j),
// g = ((b0 + b)·T + rows[j])·C. Same products and masking as apply_mask, so the same bits.
template <bool Accumulate, typename T>
void apply_rows_mask(const T* in, T* out, const int64_t* rows, const Shape& s, int64_t total,
                     int64_t b0, double p, uint64_t seed, uint64_t offset) {
  const int64_t R = s[1], C = s[2];
  const float pf = static_cast<float>(p);
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  const int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(C, 1));
  parallel_for(s[0] * R, grain, [&](int64_t lo, int64_t hi) {
    float u[kDropBuffer + 4];  // a run may start up to 3 lanes into its first Philox block
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t g = ((b0 + r / R) * total + rows[r % R]) * C;
      const T* src = in + r * C;
      T* dst = out + r * C;
      for (int64_t c0 = 0; c0 < C; c0 += kDropBuffer) {
        const int64_t c1 = std::min(C, c0 + kDropBuffer);
        const int64_t lead = (g + c0) % 4;
        draw_uniforms(seed, offset, g + c0 - lead, lead + c1 - c0, u);
        apply_run<Accumulate>(src + c0, dst + c0, u + lead, c1 - c0, pf,
                              scale);  // u[lead]: column c0
      }
    }
  });
}

// x, out (B, R, C) contiguous, same shape and dtype; rows (R) contiguous i64 in [0, total).
void check_rows_args(const char* op, const Tensor& x, const Tensor& rows, int64_t total,
                     int64_t batch_offset, const Tensor& out) {
  LOOM_CHECK(batch_offset >= 0, op, ": batch offset must be non-negative, got ", batch_offset);
  LOOM_CHECK(x.dim() == 3 && out.shape() == x.shape() && out.dtype() == x.dtype(), op,
             ": x and out must be one (B, R, C) shape and dtype, got ", shape_str(x.shape()),
             " and ", shape_str(out.shape()));
  LOOM_CHECK(x.is_contiguous() && out.is_contiguous() && rows.is_contiguous(), op,
             ": contiguous tensors expected");
  LOOM_CHECK(rows.dtype() == DType::kI64 && rows.dim() == 1 && rows.size(0) == x.size(1), op,
             ": rows must be (", x.size(1), ") i64, got ", shape_str(rows.shape()), " ",
             dtype_name(rows.dtype()));
  const int64_t* r = rows.data<int64_t>();
  for (int64_t j = 0; j < rows.size(0); ++j) {
    LOOM_CHECK(r[j] >= 0 && r[j] < total, op, ": row ", r[j], " outside [0, ", total, ")");
  }
}

void dropout_rows_forward_cpu(const Tensor& x, const Tensor& rows, int64_t total, int64_t b0,
                              double p, uint64_t seed, uint64_t offset, Tensor& y) {
  check_rows_args("dropout_rows_forward", x, rows, total, b0, y);
  LOOM_DISPATCH_FLOAT(x.dtype(), "dropout_rows_forward", [&] {
    apply_rows_mask<false>(x.data<scalar_t>(), y.data<scalar_t>(), rows.data<int64_t>(), x.shape(),
                           total, b0, p, seed, offset);
  });
}

void dropout_rows_backward_cpu(const Tensor& dy, const Tensor& rows, int64_t total, int64_t b0,
                               double p, uint64_t seed, uint64_t offset, Tensor& dx) {
  check_rows_args("dropout_rows_backward", dy, rows, total, b0, dx);
  LOOM_DISPATCH_FLOAT(dy.dtype(), "dropout_rows_backward", [&] {
    apply_rows_mask<true>(dy.data<scalar_t>(), dx.data<scalar_t>(), rows.data<int64_t>(),
                          dy.shape(), total, b0, p, seed, offset);
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
LOOM_REGISTER_KERNEL(dropout_rows_forward, kCpu, dropout_rows_forward_cpu);
LOOM_REGISTER_KERNEL(dropout_rows_backward, kCpu, dropout_rows_backward_cpu);

}  // namespace loom::kernels::cpu
