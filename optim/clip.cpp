// optim/clip.cpp — gradient norm (ops::sum_squares, one fused pass per tensor) and clipping, by
// a factor on the host or one left on the gradients' device.
#include "optim/clip.h"

#include <cmath>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace loom::optim {

Tensor grad_sq_sum_tensor(const std::vector<Tensor>& grads, std::optional<Device> device) {
  autograd::NoGradGuard no_grad;
  Tensor total;  // per-tensor sums (the fused thread-count-independent kernel), added in order
  for (const Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    if (!device) device = g.device();
    LOOM_CHECK(g.device() == *device, "grad_sq_sum: gradients on ", device->str(), " and ",
               g.device().str());
    const Tensor s = ops::sum_squares(g.detach());
    total = total.defined() ? ops::add(total, s) : s;
  }
  return total.defined() ? total : Tensor::zeros({}, DType::kF64, device.value_or(Device::cpu()));
}

double grad_sq_sum(const std::vector<Tensor>& grads) { return grad_sq_sum_tensor(grads).item(); }

double global_grad_norm(const std::vector<Tensor>& grads) { return std::sqrt(grad_sq_sum(grads)); }

double clip_scale(double norm, double max_norm) {
  LOOM_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  return kernels::clip_factor(norm, max_norm);
}

Tensor clip_scale_tensor(const Tensor& sq_sum, double max_norm) {
  LOOM_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  LOOM_CHECK(sq_sum.numel() == 1 && sq_sum.dtype() == DType::kF64,
             "clip_scale_tensor: the sum of squares must be one f64 element, got ",
             shape_str(sq_sum.shape()), " ", dtype_name(sq_sum.dtype()));
  Tensor out = Tensor::empty({}, DType::kF64, sq_sum.device());
  kernels::call_kernel<kernels::clip_factor_forward_k>(sq_sum.contiguous(), max_norm, out);
  return out;
}

void scale_grads(const std::vector<Tensor>& grads, double factor) {
  if (factor == 1.0) return;
  autograd::NoGradGuard no_grad;
  for (const Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    Tensor out = g;
    if (g.is_contiguous()) {
      kernels::call_kernel<kernels::scale_forward_k>(g, factor, out);  // element-wise, in place
    } else {
      ops::copy_(out, ops::scale(g, factor));
    }
  }
}

double clip_grad_norm(const std::vector<Tensor>& grads, double max_norm) {
  const double norm = global_grad_norm(grads);
  scale_grads(grads, clip_scale(norm, max_norm));
  return norm;
}

}  // namespace loom::optim
