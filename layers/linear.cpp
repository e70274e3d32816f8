// layers/linear.cpp — Linear (see layers/linear.h).
#include "layers/linear.h"

#include "core/ops/matmul.h"
#include "layers/init.h"

namespace loom {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, DType dtype, Device device)
    : in_features_(in_features), out_features_(out_features) {
  LOOM_CHECK(in_features > 0 && out_features > 0, "Linear: sizes must be positive, got in ",
             in_features, ", out ", out_features);
  weight_ = register_parameter("weight", Tensor::zeros({out_features, in_features}, dtype, device));
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({out_features}, dtype, device));
}

Tensor Linear::forward(const Tensor& x) const {
  LOOM_CHECK(x.dim() >= 1 && x.size(-1) == in_features_, "Linear: input ", shape_str(x.shape()),
             " does not end in in_features ", in_features_);
  // Note [Compute dtype]; with a bias, one GEMM with the bias epilogue (ops::linear).
  return ops::linear(x, compute(weight_), bias_.defined() ? compute(bias_) : Tensor());
}

void Linear::zero_rows_from(int64_t row) { init::zero_rows_from_(weight_, row); }

void Linear::init(Generator& gen, double std) {
  init::normal_(weight_, gen, std);
  if (bias_.defined()) init::fill_(bias_, 0.0);
}

}  // namespace loom
