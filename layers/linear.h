// layers/linear.h — Linear: y = x·Wᵀ + b with W (out, in), the layer that holds the model's
// matrices. A plain single-device layer (what the single-device LinearFactory of
// layers/build_context.h makes); tensor-parallel variants replace it through the LayerContext
// and must keep its parameter names and layout.
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "core/tensor.h"
#include "layers/build_context.h"

namespace loom {

class Linear : public LinearLayer {
 public:
  // weight (out_features, in_features); bias (out_features) when `bias`.
  Linear(int64_t in_features, int64_t out_features, bool bias, DType dtype = DType::kF32,
         Device device = {});
  // x (…, in) → (…, out), one GEMM: ops::linear (the bias fused into the GEMM's epilogue).
  Tensor forward(const Tensor& x) const override;
  // weight ← N(0, std²), bias ← 0.
  void init(Generator& gen, double std) override;
  void zero_rows_from(int64_t row) override;
  bool plain() const override { return true; }

  const Tensor& weight() const override { return weight_; }
  const Tensor& bias() const override { return bias_; }  // undefined without bias
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_, out_features_;
  Tensor weight_;
  Tensor bias_;
};

}  // namespace loom
