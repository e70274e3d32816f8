// core/ops/reduce.cpp — sum/mean front-ends; backward broadcasts the gradient back.
#include "core/ops/reduce.h"

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "kernels/reduce.h"

namespace loom::ops {

Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  dim = wrap_dim(dim, x.dim(), "sum");
  const Tensor xc = contiguous(x.detach());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  Shape kept = x.shape();
  kept[dim] = 1;
  Tensor out = Tensor::zeros(kept, x.dtype(), x.device());
  if (x.numel() > 0) {
    kernels::call_kernel<kernels::sum_dim_forward_k>(xc, outer, x.size(dim), inner, out);
  }
  if (autograd::needs_grad({&x})) {
    const Shape in_shape = x.shape();
    autograd::record_function("sum", {x}, {&out}, [in_shape](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{expand(g[0], in_shape)};
    });
  }
  return keepdim ? out : squeeze(out, dim);
}

Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  const int64_t n = x.size(dim);
  return scale(sum(x, dim, keepdim), 1.0 / static_cast<double>(n));
}

Tensor sum(const Tensor& x) { return squeeze(sum(reshape(x, {-1}), 0, true), 0); }

Tensor mean(const Tensor& x) { return scale(sum(x), 1.0 / static_cast<double>(x.numel())); }

Tensor sum_squares(const Tensor& x) {
  Tensor out = Tensor::zeros({}, DType::kF64, x.device());
  if (x.numel() > 0)
    kernels::call_kernel<kernels::sum_squares_forward_k>(contiguous(x.detach()), out);
  if (autograd::needs_grad({&x})) {
    const Tensor saved = x.detach();
    autograd::record_function("sum_squares", {x}, {&out}, [saved](const std::vector<Tensor>& g) {
      // d(Σx²)/dx = 2x, times the incoming scalar (an f64 0-d tensor).
      return std::vector<Tensor>{mul(scale(saved, 2.0), g[0].to(saved.dtype()))};
    });
  }
  return out;
}

Tensor sum_to_shape(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  LOOM_CHECK(x.shape().size() >= shape.size(), "sum_to_shape: ", shape_str(x.shape()),
             " cannot reduce to ", shape_str(shape));
  Tensor r = x;
  const size_t lead = x.shape().size() - shape.size();
  if (lead > 0) {
    Shape s{-1};
    s.insert(s.end(), x.shape().begin() + static_cast<int64_t>(lead), x.shape().end());
    r = sum(reshape(r, s), 0, false);
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1 && r.size(static_cast<int64_t>(d)) != 1)
      r = sum(r, static_cast<int64_t>(d), true);
  }
  LOOM_CHECK(r.shape() == shape, "sum_to_shape: ", shape_str(x.shape()), " does not broadcast to ",
             shape_str(shape));
  return r;
}

}  // namespace loom::ops
