// kernels/norm.h — LayerNorm and RMSNorm over the last dimension, forward and backward.
// x is read as contiguous (N, C) with C = x.size(-1); weight and bias are (C); the saved row
// statistics (mean, rstd) are (N) in norm_stat_dtype(x's dtype): x's dtype for f32/f64, f32 for
// bf16/f16 (a device backend computes in f32 there). Backward kernels accumulate (dx += …,
// dweight += …, dbias += …) and never allocate their outputs. Also: the fused residual add +
// LayerNorm (the sum s = x + r is returned and saved; the LayerNorm is of s).
//
// Note [Deterministic row reductions]: dweight and dbias sum over all N rows. The rows are split
// into chunks of max(kNormRowChunk, ⌈N / kNormMaxChunks⌉) rows — a function of N only, never of
// the thread count; each chunk's partial sums (in f64) are formed by one thread in row order, then
// the partials are added in chunk order. The bits are therefore the same with 1 or 64 threads.
// A device backend need not match the CPU bits, only be deterministic in the same sense.
#pragma once

#include "kernels/registry.h"

namespace loom::kernels {
constexpr int64_t kNormRowChunk = 32;
constexpr int64_t kNormMaxChunks = 256;

// The dtype of the saved row statistics for inputs of dtype x.
inline DType norm_stat_dtype(DType x) {
  return x == DType::kBF16 || x == DType::kF16 ? DType::kF32 : x;
}
}  // namespace loom::kernels

// mean = Σx/C; rstd = 1/√(Σ(x−mean)²/C + eps); y = (x − mean)·rstd·weight + bias.
// bias may be undefined (no bias). Statistics are accumulated in f64 on the CPU (a device
// backend may use f32 for f32 and 16-bit x: kernels/cuda/norm.cu).
LOOM_DECLARE_KERNEL(layer_norm_forward, void(const loom::Tensor& x,       // x (N, C)
                                             const loom::Tensor& weight,  // weight (C)
                                             const loom::Tensor& bias,    // bias (C) or undefined
                                             double eps,
                                             loom::Tensor& y,       // y (N, C)
                                             loom::Tensor& mean,    // mean (N)
                                             loom::Tensor& rstd));  // rstd (N)
// With x̂ = (x − mean)·rstd and g = dy·weight:
//   dx += rstd·(g − mean_C(g) − x̂·mean_C(g·x̂));  dweight += Σ_N dy·x̂;  dbias += Σ_N dy.
// dbias may be undefined (the forward had no bias).
LOOM_DECLARE_KERNEL(layer_norm_backward, void(const loom::Tensor& dy,      // dy (N, C)
                                              const loom::Tensor& x,       // x (N, C)
                                              const loom::Tensor& weight,  // weight (C)
                                              const loom::Tensor& mean,    // mean (N)
                                              const loom::Tensor& rstd,    // rstd (N)
                                              loom::Tensor& dx,            // dx (N, C)
                                              loom::Tensor& dweight,       // dweight (C)
                                              loom::Tensor& dbias));       // dbias (C) or undefined

// rstd = 1/√(Σx²/C + eps); y = x·rstd·weight. Statistics are accumulated as for LayerNorm.
LOOM_DECLARE_KERNEL(rms_norm_forward, void(const loom::Tensor& x,       // x (N, C)
                                           const loom::Tensor& weight,  // weight (C)
                                           double eps,
                                           loom::Tensor& y,       // y (N, C)
                                           loom::Tensor& rstd));  // rstd (N)
// With x̂ = x·rstd and g = dy·weight:  dx += rstd·(g − x̂·mean_C(g·x̂));  dweight += Σ_N dy·x̂.
LOOM_DECLARE_KERNEL(rms_norm_backward, void(const loom::Tensor& dy,      // dy (N, C)
                                            const loom::Tensor& x,       // x (N, C)
                                            const loom::Tensor& weight,  // weight (C)
                                            const loom::Tensor& rstd,    // rstd (N)
                                            loom::Tensor& dx,            // dx (N, C)
                                            loom::Tensor& dweight));     // dweight (C)

// s = x + r (rounded to x's dtype), then layer_norm_forward of s: y, mean, rstd as there.
// bias may be undefined.
LOOM_DECLARE_KERNEL(residual_layer_norm_forward,
                    void(const loom::Tensor& x,       // x (N, C)
                         const loom::Tensor& r,       // r (N, C): the residual
                         const loom::Tensor& weight,  // weight (C)
                         const loom::Tensor& bias,    // bias (C) or undefined
                         double eps,
                         loom::Tensor& s,       // s (N, C) = x + r
                         loom::Tensor& y,       // y (N, C)
                         loom::Tensor& mean,    // mean (N)
                         loom::Tensor& rstd));  // rstd (N)
// The gradient of both x and r: dx += ds + (layer_norm_backward's dx for dy at s);
// dweight, dbias as in layer_norm_backward. ds (the gradient reaching the returned sum) and
// dbias may be undefined.
LOOM_DECLARE_KERNEL(residual_layer_norm_backward,
                    void(const loom::Tensor& dy,      // dy (N, C): gradient of y
                         const loom::Tensor& ds,      // ds (N, C): gradient of s, or undefined
                         const loom::Tensor& s,       // s (N, C)
                         const loom::Tensor& weight,  // weight (C)
                         const loom::Tensor& mean,    // mean (N)
                         const loom::Tensor& rstd,    // rstd (N)
                         loom::Tensor& dx,            // dx (N, C)
                         loom::Tensor& dweight,       // dweight (C)
                         loom::Tensor& dbias));       // dbias (C) or undefined
