// kernels/cpu/softmax.cpp — CPU softmax over the last dimension, forward and backward. Each row
// is done by one thread (row sums in f64), so results do not depend on the thread count.
#include "kernels/softmax.h"

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

#ifndef LOOM_SIMD_MAX
#define LOOM_SIMD_MAX(var) _Pragma(LOOM_STRINGIFY(omp simd reduction(max : var)))
#endif

namespace loom::kernels::cpu {
namespace {

int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(cols, 1));
}

// One row: x (C), y (C).
template <typename T>
void softmax_row(const T* x, T* y, int64_t cols) {
  T mx = x[0];
  LOOM_SIMD_MAX(mx)
  for (int64_t c = 0; c < cols; ++c) mx = x[c] > mx ? x[c] : mx;
  double s = 0;
  LOOM_SIMD_SUM(s)
  for (int64_t c = 0; c < cols; ++c) {
    const T e = vexp(x[c] - mx);
    y[c] = e;
    s += e;
  }
  const T inv = static_cast<T>(1.0 / s);
  LOOM_SIMD
  for (int64_t c = 0; c < cols; ++c) y[c] *= inv;
}

void softmax_forward_cpu(const Tensor& x, Tensor& y) {
  const int64_t cols = x.size(-1), rows = cols > 0 ? x.numel() / cols : 0;
  LOOM_DISPATCH_FLOAT(x.dtype(), "softmax_forward", [&] {
    const scalar_t* px = x.data<scalar_t>();
    scalar_t* py = y.data<scalar_t>();
    parallel_for(rows, row_grain(cols), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) softmax_row(px + r * cols, py + r * cols, cols);
    });
  });
}

void softmax_backward_cpu(const Tensor& y, const Tensor& dy, Tensor& dx) {
  const int64_t cols = y.size(-1), rows = cols > 0 ? y.numel() / cols : 0;
  LOOM_DISPATCH_FLOAT(y.dtype(), "softmax_backward", [&] {
    const scalar_t* py = y.data<scalar_t>();
    const scalar_t* pdy = dy.data<scalar_t>();
    scalar_t* pdx = dx.data<scalar_t>();
    parallel_for(rows, row_grain(cols), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const scalar_t* yr = py + r * cols;
        const scalar_t* dyr = pdy + r * cols;
        scalar_t* dxr = pdx + r * cols;
        double dot = 0;
        LOOM_SIMD_SUM(dot)
        for (int64_t c = 0; c < cols; ++c) dot += dyr[c] * yr[c];
        const scalar_t d = static_cast<scalar_t>(dot);
        LOOM_SIMD
        for (int64_t c = 0; c < cols; ++c) dxr[c] += yr[c] * (dyr[c] - d);
      }
    });
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(softmax_forward, kCpu, softmax_forward_cpu);
LOOM_REGISTER_KERNEL(softmax_backward, kCpu, softmax_backward_cpu);

}  // namespace loom::kernels::cpu
