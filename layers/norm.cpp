// layers/norm.cpp — LayerNorm and RMSNorm (see layers/norm.h); each is one fused op.
#include "layers/norm.h"

#include "core/ops/norm.h"
#include "layers/init.h"

namespace loom {

namespace {
// The parameter as used on this rank's activations (Note [Sequence-parallel region ops] in
// layers/build_context.h).
Tensor used(const Tensor& p, const LinearFactory& linear) {
  return p.defined() ? linear.replicated_param(p) : p;
}
}  // namespace

LayerNorm::LayerNorm(int64_t dim, double eps, bool bias, DType dtype, Device device,
                     const LayerContext& ctx)
    : eps_(eps), linear_(ctx.linear) {
  LOOM_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  weight_ = register_parameter("weight", Tensor::ones({dim}, dtype, device));
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({dim}, dtype, device));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  return ops::layer_norm(x, used(compute(weight_), *linear_), used(compute(bias_), *linear_),
                         eps_);  // Note [Compute dtype]
}

void LayerNorm::reset() {
  init::fill_(weight_, 1.0);
  if (bias_.defined()) init::fill_(bias_, 0.0);
}

RMSNorm::RMSNorm(int64_t dim, double eps, DType dtype, Device device, const LayerContext& ctx,
                 bool per_head)
    : eps_(eps), linear_(ctx.linear), per_head_(per_head) {
  LOOM_CHECK(dim > 0, "RMSNorm: dim must be positive, got ", dim);
  weight_ = register_parameter("weight", Tensor::ones({dim}, dtype, device));
}

Tensor RMSNorm::forward(const Tensor& x) const {
  const Tensor w = compute(weight_);
  return ops::rms_norm(x, per_head_ ? linear_->head_param(w) : used(w, *linear_), eps_);
}

void RMSNorm::reset() { init::fill_(weight_, 1.0); }

}  // namespace loom
