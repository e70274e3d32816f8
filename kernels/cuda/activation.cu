// kernels/cuda/activation.cu — CUDA GELU (tanh form, through the sigmoid as in
// Note [GELU through the sigmoid], kernels/cpu/activation.cpp), SiLU and SwiGLU, forward and
// backward, for f32/f64 and bf16/f16 storage (f32 math). Contracts of kernels/activation.h:
// contiguous tensors of one shape and dtype; backward kernels accumulate. Vectorised through
// vec_map.cuh on the compute stream; must not synchronise the host or allocate.
#include "kernels/activation.h"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/vec_map.cuh"

namespace loom::kernels::cuda {
namespace {

template <typename C>
__device__ __forceinline__ C silu_grad(C x) {
  const C s = sigmoid(x);
  return s * (C(1) + x * (C(1) - s));
}

struct GeluForwardFn {
  static constexpr bool kReadsOut = false;
  template <int V, typename C>
  __device__ void apply(int64_t, C (&x)[1][V], C (&y)[1][V]) const {
#pragma unroll
    for (int j = 0; j < V; ++j) y[0][j] = gelu_value(x[0][j]);
  }
};

struct SiluForwardFn {
  static constexpr bool kReadsOut = false;
  template <int V, typename C>
  __device__ void apply(int64_t, C (&x)[1][V], C (&y)[1][V]) const {
#pragma unroll
    for (int j = 0; j < V; ++j) y[0][j] = x[0][j] * sigmoid(x[0][j]);
  }
};

// dx += dy · f'(x)   (inputs x, dy; output dx)
template <bool Gelu>
struct ActivationBackwardFn {
  static constexpr bool kReadsOut = true;
  template <int V, typename C>
  __device__ void apply(int64_t, C (&x)[2][V], C (&y)[1][V]) const {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const C d = Gelu ? gelu_grad(x[0][j]) : silu_grad(x[0][j]);
      y[0][j] += x[1][j] * d;
    }
  }
};

// y = silu(gate) · up   (inputs gate, up)
struct SwigluForwardFn {
  static constexpr bool kReadsOut = false;
  template <int V, typename C>
  __device__ void apply(int64_t, C (&x)[2][V], C (&y)[1][V]) const {
#pragma unroll
    for (int j = 0; j < V; ++j) y[0][j] = x[0][j] * sigmoid(x[0][j]) * x[1][j];
  }
};

// dgate += dy · up · silu'(gate); dup += dy · silu(gate)   (inputs gate, up, dy)
struct SwigluBackwardFn {
  static constexpr bool kReadsOut = true;
  template <int V, typename C>
  __device__ void apply(int64_t, C (&x)[3][V], C (&y)[2][V]) const {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const C g = x[0][j], u = x[1][j], dy = x[2][j];
      const C s = sigmoid(g);
      y[0][j] += dy * u * s * (C(1) + g * (C(1) - s));
      y[1][j] += dy * g * s;
    }
  }
};

// Runs f with inputs `ins` and outputs `outs` (all contiguous, one shape, one dtype).
template <int NIn, int NOut, typename F>
void run_map(const char* op, const std::array<const Tensor*, NIn>& ins,
             const std::array<Tensor*, NOut>& outs, const F& f) {
  const Tensor& ref = *ins[0];
  for (const Tensor* t : ins) check_same_contiguous(op, ref, {t});
  for (const Tensor* t : outs) check_same_contiguous(op, ref, {t});
  if (ref.numel() == 0) return;
  CudaDeviceGuard guard(ref.device().index);
  LOOM_CUDA_DISPATCH_FLOAT(ref.dtype(), op, [&] {
    using T = scalar_t;
    MapPtrs<NIn, NOut, T> p;
    for (int a = 0; a < NIn; ++a) p.in[a] = static_cast<const T*>(ins[a]->raw_data());
    for (int b = 0; b < NOut; ++b) p.out[b] = static_cast<T*>(outs[b]->raw_data());
    launch_map<T>(p, ref.numel(), f);
  });
}

void gelu_forward_cuda(const Tensor& x, Tensor& y) {
  run_map<1, 1>("gelu_forward", {&x}, {&y}, GeluForwardFn{});
}

void gelu_backward_cuda(const Tensor& x, const Tensor& dy, Tensor& dx) {
  run_map<2, 1>("gelu_backward", {&x, &dy}, {&dx}, ActivationBackwardFn<true>{});
}

void silu_forward_cuda(const Tensor& x, Tensor& y) {
  run_map<1, 1>("silu_forward", {&x}, {&y}, SiluForwardFn{});
}

void silu_backward_cuda(const Tensor& x, const Tensor& dy, Tensor& dx) {
  run_map<2, 1>("silu_backward", {&x, &dy}, {&dx}, ActivationBackwardFn<false>{});
}

void swiglu_forward_cuda(const Tensor& gate, const Tensor& up, Tensor& y) {
  run_map<2, 1>("swiglu_forward", {&gate, &up}, {&y}, SwigluForwardFn{});
}

void swiglu_backward_cuda(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,
                          Tensor& dup) {
  run_map<3, 2>("swiglu_backward", {&gate, &up, &dy}, {&dgate, &dup}, SwigluBackwardFn{});
}

}  // namespace

LOOM_REGISTER_KERNEL(gelu_forward, kCuda, gelu_forward_cuda);
LOOM_REGISTER_KERNEL(gelu_backward, kCuda, gelu_backward_cuda);
LOOM_REGISTER_KERNEL(silu_forward, kCuda, silu_forward_cuda);
LOOM_REGISTER_KERNEL(silu_backward, kCuda, silu_backward_cuda);
LOOM_REGISTER_KERNEL(swiglu_forward, kCuda, swiglu_forward_cuda);
LOOM_REGISTER_KERNEL(swiglu_backward, kCuda, swiglu_backward_cuda);

}  // namespace loom::kernels::cuda
