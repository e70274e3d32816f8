// kernels/cuda/gelu.cuh — the GELU (tanh form) value and derivative as device functions, through
// the sigmoid as the CPU kernels compute them (Note [GELU through the sigmoid],
// kernels/cpu/activation.cpp): gelu(x) = x·σ(u2), gelu'(x) = σ + x·σ·(1 − σ)·u2', with
// u2 = 2·√(2/π)·(x + 0.044715·x³). Shared by the activation kernels (activation.cu) and the GEMM
// epilogues that GELU is fused into (matmul.cu), so both compute one formula. C is the compute
// type (float or double); accurate exp.
#pragma once

#include <cuda_runtime.h>

namespace loom::kernels::cuda {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

template <typename C>
__device__ __forceinline__ C gelu_value(C x) {
  const C k2 = C(2 * 0.7978845608028654);  // 2·√(2/π)
  const C c = C(0.044715);
  return x * sigmoid(k2 * (x + c * x * x * x));
}

template <typename C>
__device__ __forceinline__ C gelu_grad(C x) {
  const C k2 = C(2 * 0.7978845608028654);
  const C c = C(0.044715);
  const C s = sigmoid(k2 * (x + c * x * x * x));
  return s + x * s * (C(1) - s) * k2 * (C(1) + C(3) * c * x * x);
}

}  // namespace loom::kernels::cuda
