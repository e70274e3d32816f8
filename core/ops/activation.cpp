// core/ops/activation.cpp — gelu/silu/swiglu front-ends and their backward nodes. Inputs are
// saved detached and contiguous; backward calls the accumulating kernels on zeroed gradients.
#include "core/ops/activation.h"

#include "core/autograd.h"
#include "core/ops/view.h"
#include "kernels/activation.h"

namespace loom::ops {
namespace {

// y = F(x) through the forward kernel FwdK; backward dx = BwdK(x, dy).
template <typename FwdK, typename BwdK>
Tensor unary_activation(const char* name, const Tensor& x) {
  const Tensor xc = contiguous(x.detach());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (y.numel() > 0) kernels::call_kernel<FwdK>(xc, y);
  if (autograd::needs_grad({&x})) {
    autograd::record_function(name, {x}, {&y}, [xc](const std::vector<Tensor>& g) {
      Tensor dx = Tensor::zeros_like(xc);
      if (g[0].defined() && dx.numel() > 0) kernels::call_kernel<BwdK>(xc, contiguous(g[0]), dx);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace

Tensor gelu(const Tensor& x) {
  return unary_activation<kernels::gelu_forward_k, kernels::gelu_backward_k>("gelu", x);
}

Tensor silu(const Tensor& x) {
  return unary_activation<kernels::silu_forward_k, kernels::silu_backward_k>("silu", x);
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  LOOM_CHECK(gate.shape() == up.shape(), "swiglu: gate ", shape_str(gate.shape()), " and up ",
             shape_str(up.shape()), " must have the same shape");
  LOOM_CHECK(gate.dtype() == up.dtype(), "swiglu: dtypes ", dtype_name(gate.dtype()), " and ",
             dtype_name(up.dtype()), " differ");
  const Tensor gc = contiguous(gate.detach()), uc = contiguous(up.detach());
  Tensor y = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  if (y.numel() > 0) kernels::call_kernel<kernels::swiglu_forward_k>(gc, uc, y);
  if (autograd::needs_grad({&gate, &up})) {
    autograd::record_function("swiglu", {gate, up}, {&y}, [gc, uc](const std::vector<Tensor>& g) {
      Tensor dgate = Tensor::zeros_like(gc), dup = Tensor::zeros_like(uc);
      if (g[0].defined() && dgate.numel() > 0) {
        kernels::call_kernel<kernels::swiglu_backward_k>(gc, uc, contiguous(g[0]), dgate, dup);
      }
      return std::vector<Tensor>{dgate, dup};
    });
  }
  return y;
}

}  // namespace loom::ops
