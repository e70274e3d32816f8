// kernels/cpu/activation.cpp — CPU GELU (tanh form), SiLU and SwiGLU, forward and backward.
// Element-wise, so any split is deterministic; vectorised (omp simd, exp from vec_math.h) over
// fixed chunks. The math is done in the tensor's own type (f32 or f64). Outputs come from the
// caller.
#include "kernels/activation.h"

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace loom::kernels::cpu {
namespace {

// Note [GELU through the sigmoid]: 0.5·x·(1 + tanh(u)) = x·σ(2u) exactly, so GELU needs one
// vectorisable exp and no tanh, and keeps full relative accuracy in both tails.
// With u2 = 2·√(2/π)·(x + 0.044715·x³): gelu(x) = x·σ(u2), gelu'(x) = σ + x·σ·(1 − σ)·u2'.
template <typename T>
[[gnu::always_inline]] inline T gelu_value(T x) {
  const T k2 = T(2 * 0.7978845608028654);  // 2·√(2/π)
  const T c = T(0.044715);
  return x * vsigmoid(k2 * (x + c * x * x * x));
}

template <typename T>
[[gnu::always_inline]] inline T gelu_grad(T x) {
  const T k2 = T(2 * 0.7978845608028654);
  const T c = T(0.044715);
  const T s = vsigmoid(k2 * (x + c * x * x * x));
  return s + x * s * (T(1) - s) * k2 * (T(1) + T(3) * c * x * x);
}

template <typename T>
[[gnu::always_inline]] inline T silu_grad(T x) {
  const T s = vsigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

// y[i] = f(x[i]) over n contiguous elements.
template <typename T, typename F>
void map1(const T* x, T* y, int64_t n, F f) {
  parallel_for(n, kElementGrain, [&](int64_t lo, int64_t hi) {
    LOOM_SIMD
    for (int64_t i = lo; i < hi; ++i) y[i] = f(x[i]);
  });
}

// dx[i] += dy[i] · f'(x[i]) over n contiguous elements.
template <typename T, typename F>
void accumulate_grad(const T* x, const T* dy, T* dx, int64_t n, F fprime) {
  parallel_for(n, kElementGrain, [&](int64_t lo, int64_t hi) {
    LOOM_SIMD
    for (int64_t i = lo; i < hi; ++i) dx[i] += dy[i] * fprime(x[i]);
  });
}

void gelu_forward_cpu(const Tensor& x, Tensor& y) {
  LOOM_DISPATCH_FLOAT(x.dtype(), "gelu_forward", [&] {
    map1(x.data<scalar_t>(), y.data<scalar_t>(), x.numel(),
         [](scalar_t v) { return gelu_value(v); });
  });
}

void gelu_backward_cpu(const Tensor& x, const Tensor& dy, Tensor& dx) {
  LOOM_DISPATCH_FLOAT(x.dtype(), "gelu_backward", [&] {
    accumulate_grad(x.data<scalar_t>(), dy.data<scalar_t>(), dx.data<scalar_t>(), x.numel(),
                    [](scalar_t v) { return gelu_grad(v); });
  });
}

void silu_forward_cpu(const Tensor& x, Tensor& y) {
  LOOM_DISPATCH_FLOAT(x.dtype(), "silu_forward", [&] {
    map1(x.data<scalar_t>(), y.data<scalar_t>(), x.numel(),
         [](scalar_t v) { return v * vsigmoid(v); });
  });
}

void silu_backward_cpu(const Tensor& x, const Tensor& dy, Tensor& dx) {
  LOOM_DISPATCH_FLOAT(x.dtype(), "silu_backward", [&] {
    accumulate_grad(x.data<scalar_t>(), dy.data<scalar_t>(), dx.data<scalar_t>(), x.numel(),
                    [](scalar_t v) { return silu_grad(v); });
  });
}

void swiglu_forward_cpu(const Tensor& gate, const Tensor& up, Tensor& y) {
  LOOM_DISPATCH_FLOAT(gate.dtype(), "swiglu_forward", [&] {
    const scalar_t* pg = gate.data<scalar_t>();
    const scalar_t* pu = up.data<scalar_t>();
    scalar_t* py = y.data<scalar_t>();
    parallel_for(gate.numel(), kElementGrain, [&](int64_t lo, int64_t hi) {
      LOOM_SIMD
      for (int64_t i = lo; i < hi; ++i) py[i] = pg[i] * vsigmoid(pg[i]) * pu[i];
    });
  });
}

void swiglu_backward_cpu(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,
                         Tensor& dup) {
  LOOM_DISPATCH_FLOAT(gate.dtype(), "swiglu_backward", [&] {
    const scalar_t* pg = gate.data<scalar_t>();
    const scalar_t* pu = up.data<scalar_t>();
    const scalar_t* pdy = dy.data<scalar_t>();
    scalar_t* pdg = dgate.data<scalar_t>();
    scalar_t* pdu = dup.data<scalar_t>();
    parallel_for(gate.numel(), kElementGrain, [&](int64_t lo, int64_t hi) {
      LOOM_SIMD
      for (int64_t i = lo; i < hi; ++i) {
        const scalar_t g = pg[i];
        const scalar_t s = vsigmoid(g);
        pdg[i] += pdy[i] * pu[i] * s * (scalar_t(1) + g * (scalar_t(1) - s));
        pdu[i] += pdy[i] * g * s;
      }
    });
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(gelu_forward, kCpu, gelu_forward_cpu);
LOOM_REGISTER_KERNEL(gelu_backward, kCpu, gelu_backward_cpu);
LOOM_REGISTER_KERNEL(silu_forward, kCpu, silu_forward_cpu);
LOOM_REGISTER_KERNEL(silu_backward, kCpu, silu_backward_cpu);
LOOM_REGISTER_KERNEL(swiglu_forward, kCpu, swiglu_forward_cpu);
LOOM_REGISTER_KERNEL(swiglu_backward, kCpu, swiglu_backward_cpu);

}  // namespace loom::kernels::cpu
