// kernels/cpu/rope.cpp — CPU rotary embedding, forward and backward (Note [RoPE pairing] in
// kernels/rope.h). Parallel over token positions: each thread builds the cos/sin row of its
// positions once and applies it to every (batch, head); each output is written by one thread.
#include "kernels/rope.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace loom::kernels::cpu {
namespace {

struct RopeDims {
  int64_t b, t, h, d;
};

RopeDims rope_dims(const Tensor& x, const Tensor& positions, const RopeFrequencies& f,
                   const Tensor& out, const char* name) {
  LOOM_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, name, ": x must be (B, T, H, D) with D even, got ",
             shape_str(x.shape()));
  LOOM_CHECK(out.shape() == x.shape() && out.dtype() == x.dtype(), name, ": output must match x");
  LOOM_CHECK(x.is_contiguous() && out.is_contiguous() && positions.is_contiguous(), name,
             ": tensors must be contiguous");
  LOOM_CHECK(positions.dim() == 1 && positions.size(0) == x.size(1), name, ": positions must be (",
             x.size(1), "), got ", shape_str(positions.shape()));
  LOOM_CHECK(static_cast<int64_t>(f.inv_freq.size()) == x.size(3) / 2, name, ": ",
             f.inv_freq.size(), " frequencies for head dim ", x.size(3));
  return {x.size(0), x.size(1), x.size(2), x.size(3)};
}

// positions (T) of any index dtype, widened to double.
std::vector<double> positions_as_double(const Tensor& positions) {
  std::vector<double> pos(static_cast<size_t>(positions.numel()));
  LOOM_DISPATCH_INDEX(positions.dtype(), "rope", [&] {
    const index_t* p = positions.data<index_t>();
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<double>(p[i]);
  });
  return pos;
}

// Applies the rotation (Sign = +1) or its inverse (Sign = −1) to in, writing (Accumulate =
// false) or adding (true) into out. in, out (B, T, H, D); pos (T).
template <typename T, int Sign, bool Accumulate>
void rope_apply(const T* in, const std::vector<double>& pos, const RopeFrequencies& f,
                const RopeDims& s, T* out) {
  const int64_t half = s.d / 2;
  const std::vector<double>& inv_freq = f.inv_freq;
  const int64_t per_t = std::max<int64_t>(s.b * s.h * s.d, 1);
  parallel_for(s.t, std::max<int64_t>(1, kElementGrain / per_t), [&](int64_t lo, int64_t hi) {
    std::vector<T> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    for (int64_t t = lo; t < hi; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double a = pos[t] * inv_freq[i];
        cs[i] = static_cast<T>(f.scale * std::cos(a));
        sn[i] = static_cast<T>(Sign * f.scale * std::sin(a));
      }
      const T* c = cs.data();
      const T* sv = sn.data();
      for (int64_t b = 0; b < s.b; ++b) {
        for (int64_t h = 0; h < s.h; ++h) {
          const int64_t base = ((b * s.t + t) * s.h + h) * s.d;
          const T* x1 = in + base;
          const T* x2 = x1 + half;
          T* y1 = out + base;
          T* y2 = y1 + half;
          LOOM_SIMD
          for (int64_t i = 0; i < half; ++i) {
            const T r1 = x1[i] * c[i] - x2[i] * sv[i];
            const T r2 = x2[i] * c[i] + x1[i] * sv[i];
            if constexpr (Accumulate) {
              y1[i] += r1;
              y2[i] += r2;
            } else {
              y1[i] = r1;
              y2[i] = r2;
            }
          }
        }
      }
    }
  });
}

void rope_forward_cpu(const Tensor& x, const Tensor& positions, const RopeFrequencies& f,
                      Tensor& y) {
  const RopeDims s = rope_dims(x, positions, f, y, "rope_forward");
  const std::vector<double> pos = positions_as_double(positions);
  LOOM_DISPATCH_FLOAT(x.dtype(), "rope_forward", [&] {
    rope_apply<scalar_t, 1, false>(x.data<scalar_t>(), pos, f, s, y.data<scalar_t>());
  });
}

void rope_backward_cpu(const Tensor& dy, const Tensor& positions, const RopeFrequencies& f,
                       Tensor& dx) {
  const RopeDims s = rope_dims(dy, positions, f, dx, "rope_backward");
  const std::vector<double> pos = positions_as_double(positions);
  LOOM_DISPATCH_FLOAT(dy.dtype(), "rope_backward", [&] {
    rope_apply<scalar_t, -1, true>(dy.data<scalar_t>(), pos, f, s, dx.data<scalar_t>());
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(rope_forward, kCpu, rope_forward_cpu);
LOOM_REGISTER_KERNEL(rope_backward, kCpu, rope_backward_cpu);

}  // namespace loom::kernels::cpu
