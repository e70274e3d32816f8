// kernels/adamw.h — the fused AdamW update: one pass over a parameter updates its two moment
// buffers and the parameter itself; adamw_multi_step does that for a whole list of parameters
// (one launch on CUDA) and can refresh a bf16 copy of each. Holds no policy (bias-correction
// terms, which parameters decay): the optimiser in optim/adamw.cpp decides those.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/philox.h"
#include "kernels/registry.h"

// For each element i, with t = step (1 for the first update):
//   param[i]      *= 1 - lr · weight_decay                      (decoupled decay; 0 disables)
//   exp_avg[i]     = beta1 · exp_avg[i] + (1 - beta1) · grad[i]
//   exp_avg_sq[i]  = beta2 · exp_avg_sq[i] + (1 - beta2) · grad[i]²
//   param[i]      -= lr / (1 - beta1^t) · exp_avg[i] / (sqrt(exp_avg_sq[i] / (1 - beta2^t)) + eps)
// All four tensors are contiguous, of one shape and one floating dtype (f32 or f64); the
// arithmetic is done in that dtype (scalars computed in double first). Element-wise, so the
// result does not depend on the thread count.
LOOM_DECLARE_KERNEL(adamw_step,
                    void(loom::Tensor& param, const loom::Tensor& grad, loom::Tensor& exp_avg,
                         loom::Tensor& exp_avg_sq, double lr, double beta1, double beta2,
                         double eps, double weight_decay, int64_t step));

namespace loom::kernels {

// One parameter of adamw_multi_step: param, grad, exp_avg, exp_avg_sq as for adamw_step.
struct AdamWParam {
  Tensor param, grad, exp_avg, exp_avg_sq;
  double weight_decay = 0.0;  // this parameter's decoupled factor (0 disables)
  Tensor param_bf16;          // optional (undefined: none): bf16, param's shape, contiguous
};

struct AdamWOptions {
  double lr = 0.0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t step = 1;
  // Optional (undefined: use `step`): a 0-d f64 tensor on the parameters' device holding the
  // number of updates made before this one, so that t = its value + 1 is read where it lies
  // (Note [Device step] in train/train_step.cpp). With it, a grad_scale that is not finite (an f16
  // overflow: kernels/reduce.h loss_scale_step) skips the update — nothing is written — and the
  // call advances the count by one only when the update was made (an empty list: not at all).
  Tensor step_count;
  // bf16 copies: round to nearest even, or stochastically (Note [bf16 stochastic rounding]).
  bool stochastic_rounding = false;
  uint64_t seed = 0, offset = 0;
  // Optional (undefined: none): a 0-d f64 tensor on the parameters' device whose value g_s
  // multiplies every gradient before the update, read where it lies — clipping by a factor the
  // host never reads (Note [Device step] in train/train_step.cpp). Each grad[i] becomes
  // dtype(g_s) · grad[i], as scale_forward computes it; the gradient tensors are not written.
  Tensor grad_scale;
};

// The step's scalars, computed in double from t = step: lr / (1 - beta1^t) and
// 1 / sqrt(1 - beta2^t). The one definition: the host for `step`, each thread for step_count.
struct AdamWStepScalars {
  double step_size, inv_sqrt_bc2;
};
LOOM_HD AdamWStepScalars adamw_step_scalars(double lr, double beta1, double beta2, double t) {
  return {lr / (1.0 - pow(beta1, t)), 1.0 / sqrt(1.0 - pow(beta2, t))};
}

// Note [bf16 stochastic rounding]: element i of the k-th list entry (list order, counting every
// entry) draws r = philox_bits(seed, offset + base_k, i) with base_k = Σ_{j<k} ⌈n_j / 4⌉, so a
// caller reserves Σ ⌈n_k / 4⌉ counters. The f32 bits u become (u + (r & 0xffff)) >> 16: rounded
// up with probability equal to the dropped fraction. NaN and ±inf round to nearest; a finite
// value that would carry into ±inf is truncated instead.
LOOM_HD uint16_t bf16_bits_stochastic(uint32_t f32_bits, uint32_t random) {
  const uint32_t mag = f32_bits & 0x7fffffffu;
  if (mag >= 0x7f800000u) {  // inf or NaN: as BFloat16(float)
    if (mag > 0x7f800000u) return static_cast<uint16_t>((f32_bits >> 16) | 0x40);
    return static_cast<uint16_t>(f32_bits >> 16);
  }
  const uint32_t up = (f32_bits + (random & 0xffffu)) >> 16;
  if ((up & 0x7f80u) == 0x7f80u) return static_cast<uint16_t>(f32_bits >> 16);
  return static_cast<uint16_t>(up);
}

}  // namespace loom::kernels

// adamw_step on every entry (its gradient scaled by options.grad_scale where defined), all with
// the same options; entries must share one device (CUDA: one dtype, f32 or f64). Where param_bf16
// is defined (f32 params only), it then receives the updated param rounded to bf16. Bit-identical
// to one adamw_step per entry for the f32/f64 update (with options.step_count, to the same step
// at t = count + 1 on the CPU; CUDA's pow may differ from the host's in the last bit of the step's
// scalars). There is no tensor argument to dispatch on:
// callers use find_kernel<adamw_multi_step_k>(device.type).
LOOM_DECLARE_KERNEL(adamw_multi_step, void(const std::vector<loom::kernels::AdamWParam>& params,
                                           const loom::kernels::AdamWOptions& options));
