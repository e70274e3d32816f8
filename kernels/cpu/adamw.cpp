// kernels/cpu/adamw.cpp — CPU fused AdamW update (f32, f64): OpenMP over fixed chunks, the inner
// loop vectorised. Purely element-wise: bits do not depend on the number of threads.
#include <cmath>

#include "kernels/adamw.h"
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

void adamw_step_cpu(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                    double lr, double beta1, double beta2, double eps, double weight_decay,
                    int64_t step) {
  check_adamw_args(param, grad, exp_avg, exp_avg_sq, step);
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(beta1, t);
  const double bc2 = 1.0 - std::pow(beta2, t);
  LOOM_DISPATCH_FLOAT(param.dtype(), "adamw_step", [&] {
    using T = scalar_t;
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* m = exp_avg.data<T>();
    T* v = exp_avg_sq.data<T>();
    const T decay = static_cast<T>(1.0 - lr * weight_decay);
    const T b1 = static_cast<T>(beta1), one_minus_b1 = static_cast<T>(1.0 - beta1);
    const T b2 = static_cast<T>(beta2), one_minus_b2 = static_cast<T>(1.0 - beta2);
    const T step_size = static_cast<T>(lr / bc1);
    const T inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(bc2));
    const T e = static_cast<T>(eps);
    parallel_for(param.numel(), kElementGrain, [&](int64_t lo, int64_t hi) {
LOOM_SIMD
      for (int64_t i = lo; i < hi; ++i) {
        const T gi = g[i];
        const T mi = b1 * m[i] + one_minus_b1 * gi;
        const T vi = b2 * v[i] + one_minus_b2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + e);
      }
    });
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(adamw_step, kCpu, adamw_step_cpu);

}  // namespace loom::kernels::cpu
