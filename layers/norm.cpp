// layers/norm.cpp — LayerNorm and RMSNorm (see layers/norm.h); each is one fused op.
#include "layers/norm.h"

#include "core/ops/norm.h"
#include "layers/init.h"

namespace loom {

LayerNorm::LayerNorm(int64_t dim, double eps, bool bias, DType dtype, Device device) : eps_(eps) {
  LOOM_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  weight_ = register_parameter("weight", Tensor::ones({dim}, dtype, device));
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({dim}, dtype, device));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  return ops::layer_norm(x, compute(weight_), compute(bias_), eps_);  // Note [Compute dtype]
}

void LayerNorm::reset() {
  init::fill_(weight_, 1.0);
  if (bias_.defined()) init::fill_(bias_, 0.0);
}

RMSNorm::RMSNorm(int64_t dim, double eps, DType dtype, Device device) : eps_(eps) {
  LOOM_CHECK(dim > 0, "RMSNorm: dim must be positive, got ", dim);
  weight_ = register_parameter("weight", Tensor::ones({dim}, dtype, device));
}

Tensor RMSNorm::forward(const Tensor& x) const { return ops::rms_norm(x, compute(weight_), eps_); }

void RMSNorm::reset() { init::fill_(weight_, 1.0); }

}  // namespace loom
