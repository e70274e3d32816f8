// kernels/cpu/adamw.cpp — CPU fused AdamW update (f32, f64), per parameter and over a list of
// parameters (adamw_multi_step: the same update per entry, its gradients optionally scaled by a
// factor read from a tensor, its step count optionally too, then the optional bf16 copy): OpenMP
// over fixed chunks, the inner loop vectorised. Purely element-wise: bits do not depend on the
// number of threads.
#include "kernels/adamw.h"

#include <bit>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace loom::kernels::cpu {
namespace {

void check_adamw_args(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                      const Tensor& exp_avg_sq, int64_t step) {
  LOOM_CHECK(step >= 1, "adamw_step: step must be >= 1, got ", step);
  for (const Tensor* t : {&grad, &exp_avg, &exp_avg_sq}) {
    LOOM_CHECK(t->shape() == param.shape(), "adamw_step: shape ", shape_str(t->shape()),
               " does not match the parameter's ", shape_str(param.shape()));
    LOOM_CHECK(t->dtype() == param.dtype(), "adamw_step: dtype ", dtype_name(t->dtype()),
               " does not match the parameter's ", dtype_name(param.dtype()));
  }
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq}) {
    LOOM_CHECK(t->is_contiguous(), "adamw_step: tensors must be contiguous");
  }
}

// The update of one parameter (see kernels/adamw.h); scalars computed in double first.
// grad_scale multiplies each gradient first (1 for adamw_step: exact).
template <typename T>
void update(T* p, const T* g, T* m, T* v, int64_t n, double lr, double beta1, double beta2,
            double eps, double weight_decay, int64_t step, double grad_scale) {
  const AdamWStepScalars sc = adamw_step_scalars(lr, beta1, beta2, static_cast<double>(step));
  const T decay = static_cast<T>(1.0 - lr * weight_decay);
  const T b1 = static_cast<T>(beta1), one_minus_b1 = static_cast<T>(1.0 - beta1);
  const T b2 = static_cast<T>(beta2), one_minus_b2 = static_cast<T>(1.0 - beta2);
  const T step_size = static_cast<T>(sc.step_size);
  const T inv_sqrt_bc2 = static_cast<T>(sc.inv_sqrt_bc2);
  const T e = static_cast<T>(eps);
  const T gs = static_cast<T>(grad_scale);
  parallel_for(n, kElementGrain, [&](int64_t lo, int64_t hi) {
    LOOM_SIMD
    for (int64_t i = lo; i < hi; ++i) {
      const T gi = gs * g[i];
      const T mi = b1 * m[i] + one_minus_b1 * gi;
      const T vi = b2 * v[i] + one_minus_b2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + e);
    }
  });
}

void scaled_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, double lr,
                 double beta1, double beta2, double eps, double weight_decay, int64_t step,
                 double grad_scale) {
  check_adamw_args(param, grad, exp_avg, exp_avg_sq, step);
  LOOM_DISPATCH_FLOAT(param.dtype(), "adamw_step", [&] {
    update(param.data<scalar_t>(), grad.data<scalar_t>(), exp_avg.data<scalar_t>(),
           exp_avg_sq.data<scalar_t>(), param.numel(), lr, beta1, beta2, eps, weight_decay, step,
           grad_scale);
  });
}

void adamw_step_cpu(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                    double lr, double beta1, double beta2, double eps, double weight_decay,
                    int64_t step) {
  scaled_step(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step, 1.0);
}

// copy (n) = bf16(param), to nearest or stochastically (Note [bf16 stochastic rounding]), the
// element i drawing its bits from counter `counter + i / 4`.
void write_bf16_copy(const float* param, BFloat16* copy, int64_t n, bool stochastic, uint64_t seed,
                     uint64_t counter) {
  parallel_for(n, kElementGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (stochastic) {
        const uint32_t r = philox_bits(seed, counter, static_cast<uint64_t>(i));
        copy[i].bits = bf16_bits_stochastic(std::bit_cast<uint32_t>(param[i]), r);
      } else {
        copy[i] = BFloat16(param[i]);
      }
    }
  });
}

void adamw_multi_step_cpu(const std::vector<AdamWParam>& params, const AdamWOptions& o) {
  if (params.empty()) return;  // nothing, the count included (as on CUDA)
  double grad_scale = 1.0;
  if (o.grad_scale.defined()) {
    LOOM_CHECK(o.grad_scale.numel() == 1 && o.grad_scale.dtype() == DType::kF64 &&
                   o.grad_scale.device().is_cpu(),
               "adamw_multi_step: grad_scale must be one f64 element on the cpu");
    grad_scale = *o.grad_scale.data<double>();
  }
  int64_t step = o.step;
  double* count = nullptr;
  if (o.step_count.defined()) {
    LOOM_CHECK(o.step_count.numel() == 1 && o.step_count.dtype() == DType::kF64 &&
                   o.step_count.device().is_cpu(),
               "adamw_multi_step: step_count must be one f64 element on the cpu");
    count = o.step_count.data<double>();
    if (!std::isfinite(grad_scale)) return;  // skipped: nothing written, the count kept
    step = static_cast<int64_t>(*count) + 1;
  }
  uint64_t counter = o.offset;
  for (const AdamWParam& e : params) {
    LOOM_CHECK(e.param.device() == params.front().param.device(),
               "adamw_multi_step: parameters on ", e.param.device().str(), " and ",
               params.front().param.device().str());
    Tensor param = e.param, exp_avg = e.exp_avg, exp_avg_sq = e.exp_avg_sq;
    scaled_step(param, e.grad, exp_avg, exp_avg_sq, o.lr, o.beta1, o.beta2, o.eps, e.weight_decay,
                step, grad_scale);
    if (e.param_bf16.defined()) {
      LOOM_CHECK(e.param.dtype() == DType::kF32 && e.param_bf16.dtype() == DType::kBF16 &&
                     e.param_bf16.shape() == e.param.shape() && e.param_bf16.is_contiguous(),
                 "adamw_multi_step: a bf16 copy needs an f32 parameter and a contiguous bf16 "
                 "tensor of its shape");
      write_bf16_copy(e.param.data<float>(), e.param_bf16.data<BFloat16>(), e.param.numel(),
                      o.stochastic_rounding, o.seed, counter);
    }
    counter += static_cast<uint64_t>((e.param.numel() + 3) / 4);
  }
  if (count != nullptr) *count += 1;
}

}  // namespace

LOOM_REGISTER_KERNEL(adamw_step, kCpu, adamw_step_cpu);
LOOM_REGISTER_KERNEL(adamw_multi_step, kCpu, adamw_multi_step_cpu);

}  // namespace loom::kernels::cpu
