// core/ops/embedding.cpp — embedding front-end. The ids (not differentiable) are saved detached
// for backward, which scatter-adds the output gradient into a zeroed (V, C) table gradient.
// Host ids with a device table are checked on the host and uploaded (core/ops/embedding.h).
#include "core/ops/embedding.h"

#include "core/autograd.h"
#include "core/ops/view.h"
#include "kernels/embedding.h"

namespace loom::ops {

Tensor embedding(const Tensor& ids, const Tensor& weight, bool ids_checked) {
  LOOM_CHECK(!is_floating(ids.dtype()), "embedding: ids must have an integer dtype, got ",
             dtype_name(ids.dtype()));
  LOOM_CHECK(weight.dim() == 2, "embedding: weight must be (V, C), got ",
             shape_str(weight.shape()));
  Shape out_shape = ids.shape();
  out_shape.push_back(weight.size(1));
  Tensor idc = contiguous(ids.detach());
  const Tensor wc = contiguous(weight.detach());
  const bool checked_here = ids.device().is_cpu() && !weight.device().is_cpu();
  if (checked_here) {  // on the host, then uploaded: the device kernel need not check
    LOOM_DISPATCH_INDEX(idc.dtype(), "embedding", [&] {
      kernels::check_embedding_ids(idc.data<index_t>(), idc.numel(), weight.size(0));
    });
    idc = idc.to(weight.device());
  }
  Tensor out = Tensor::empty(out_shape, weight.dtype(), weight.device());
  if (ids.numel() > 0) {
    kernels::call_kernel<kernels::embedding_forward_k>(idc, wc, out, ids_checked || checked_here);
  }
  if (autograd::needs_grad({&weight})) {
    const Shape w_shape = weight.shape();
    const DType dtype = weight.dtype();
    const Device device = weight.device();
    autograd::record_function("embedding", {weight}, {&out}, [=](const std::vector<Tensor>& g) {
      Tensor dw = Tensor::zeros(w_shape, dtype, device);
      if (g[0].defined() && idc.numel() > 0) {
        kernels::call_kernel<kernels::embedding_backward_k>(idc, contiguous(g[0]), dw,
                                                            /*ids_checked=*/true);
      }
      return std::vector<Tensor>{dw};
    });
  }
  return out;
}

}  // namespace loom::ops
