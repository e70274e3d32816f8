// core/ops/attention.cpp — causal_attention front-end: shape checks, contiguous inputs, the
// packed documents' doc_start checked and put on q's device, and a backward node that saves q,
// k, v, doc_start, out and lse (never probabilities) and calls the backward kernel once for all
// three gradients.
#include "core/ops/attention.h"

#include <cmath>

#include "core/autograd.h"
#include "core/checkpoint.h"
#include "core/ops/view.h"
#include "kernels/attention.h"

namespace loom::ops {
namespace {

void check_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  LOOM_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
             "causal_attention: q, k, v must be 4-d (B, H, T, D), got ", shape_str(q.shape()), ", ",
             shape_str(k.shape()), ", ", shape_str(v.shape()));
  LOOM_CHECK(k.shape() == v.shape(), "causal_attention: k ", shape_str(k.shape()), " and v ",
             shape_str(v.shape()), " differ");
  LOOM_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2) && q.size(3) == k.size(3),
             "causal_attention: q ", shape_str(q.shape()), " and k ", shape_str(k.shape()),
             " differ in B, T or D");
  LOOM_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "causal_attention: query heads (",
             q.size(1), ") must be a multiple of kv heads (", k.size(1), ")");
  LOOM_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), "causal_attention: dtypes ",
             dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), ", ", dtype_name(v.dtype()),
             " differ");
}

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                        const Tensor& doc_start) {
  check_attention_inputs(q, k, v);
  // Note [Packed documents]: checked where it is (the rule only on the host), then on q's device.
  const Tensor ds_in = doc_start.defined() ? contiguous(doc_start.detach()) : Tensor();
  kernels::check_doc_start(ds_in, q.size(2), "causal_attention");
  const Tensor ds = ds_in.defined() ? ds_in.to(q.device()) : Tensor();
  if (scale <= 0) scale = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(q.size(3), 1)));
  const Tensor qc = contiguous(q.detach()), kc = contiguous(k.detach()),
               vc = contiguous(v.detach());
  // lse (B, Hq, T): f32 for 16-bit inputs (Note [Attention kernel contract]).
  const DType lse_dtype = q.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  // Note [Selective recompute] in core/checkpoint.h: kept, the output and lse are reused.
  std::vector<Tensor> r = kept_or_computed(KeptOp::kAttention, [&] {
    Tensor o = Tensor::empty(q.shape(), q.dtype(), q.device());
    Tensor l = Tensor::empty({q.size(0), q.size(1), q.size(2)}, lse_dtype, q.device());
    if (o.numel() > 0)
      kernels::call_kernel<kernels::attention_forward_k>(qc, kc, vc, ds, scale, o, l);
    return std::vector<Tensor>{o, l};
  });
  Tensor out = r[0];
  const Tensor lse = r[1];
  if (autograd::needs_grad({&q, &k, &v})) {
    const Tensor out_saved = out.detach();
    autograd::record_function(
        "causal_attention", {q, k, v}, {&out}, [=](const std::vector<Tensor>& g) {
          Tensor dq = Tensor::zeros_like(qc), dk = Tensor::zeros_like(kc),
                 dv = Tensor::zeros_like(vc);
          if (out_saved.numel() > 0) {
            kernels::call_kernel<kernels::attention_backward_k>(
                qc, kc, vc, ds, out_saved, lse, contiguous(g[0]), scale, dq, dk, dv);
          }
          return std::vector<Tensor>{dq, dk, dv};
        });
  }
  return out;
}

}  // namespace loom::ops
