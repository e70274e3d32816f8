// core/ops/rope.cpp — rope front-end: checks, contiguous inputs, and the backward rule (the
// gradient is turned back by the negative angle, see kernels/rope.h).
#include "core/ops/rope.h"

#include "core/autograd.h"
#include "core/ops/view.h"
#include "kernels/rope.h"

namespace loom::ops {

Tensor rope(const Tensor& x, const Tensor& positions, double theta) {
  LOOM_CHECK(theta > 0, "rope: theta must be positive, got ", theta);
  return rope(x, positions, kernels::RopeFrequencies::plain(theta, x.dim() == 4 ? x.size(3) : 0));
}

Tensor rope(const Tensor& x, const Tensor& positions, const kernels::RopeFrequencies& f) {
  LOOM_CHECK(x.dim() == 4, "rope: x must be (B, T, H, D), got ", shape_str(x.shape()));
  LOOM_CHECK(x.size(3) % 2 == 0, "rope: head dim D must be even, got ", x.size(3));
  LOOM_CHECK(!is_floating(positions.dtype()), "rope: positions must be an integer tensor, got ",
             dtype_name(positions.dtype()));
  LOOM_CHECK(positions.dim() == 1 && positions.size(0) == x.size(1), "rope: positions must be (",
             x.size(1), "), got ", shape_str(positions.shape()));
  LOOM_CHECK(static_cast<int64_t>(f.inv_freq.size()) == x.size(3) / 2, "rope: ", f.inv_freq.size(),
             " frequencies for head dim ", x.size(3));
  const Tensor pos = contiguous(positions.detach());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (y.numel() > 0) {
    kernels::call_kernel<kernels::rope_forward_k>(contiguous(x.detach()), pos, f, y);
  }
  if (autograd::needs_grad({&x})) {
    autograd::record_function("rope", {x}, {&y}, [pos, f](const std::vector<Tensor>& g) {
      Tensor dx = Tensor::zeros(g[0].shape(), g[0].dtype(), g[0].device());
      if (dx.numel() > 0) {
        kernels::call_kernel<kernels::rope_backward_k>(contiguous(g[0]), pos, f, dx);
      }
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace loom::ops
