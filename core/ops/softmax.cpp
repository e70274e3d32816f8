// core/ops/softmax.cpp — softmax front-end. Backward needs only the output y (saved detached):
// dx = y·(dy − Σ dy·y).
#include "core/ops/softmax.h"

#include "core/autograd.h"
#include "core/ops/view.h"
#include "kernels/softmax.h"

namespace loom::ops {

Tensor softmax(const Tensor& x) {
  LOOM_CHECK(x.dim() >= 1, "softmax: input must have at least one dimension");
  const Tensor xc = contiguous(x.detach());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (y.numel() > 0) kernels::call_kernel<kernels::softmax_forward_k>(xc, y);
  if (autograd::needs_grad({&x})) {
    const Tensor ys = y.detach();
    autograd::record_function("softmax", {x}, {&y}, [ys](const std::vector<Tensor>& g) {
      Tensor dx = Tensor::zeros_like(ys);
      if (g[0].defined() && dx.numel() > 0) {
        kernels::call_kernel<kernels::softmax_backward_k>(ys, contiguous(g[0]), dx);
      }
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace loom::ops
