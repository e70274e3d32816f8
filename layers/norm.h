// layers/norm.h — normalisation layers over the last dimension: LayerNorm (GPT-2, with bias)
// and RMSNorm (Llama), behind one Norm interface so a Block picks either by configuration.
#pragma once

#include <cstdint>
#include <memory>

#include "core/tensor.h"
#include "layers/build_context.h"
#include "layers/module.h"

namespace loom {

class Norm : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;  // x (…, C) → (…, C)
  // weight ← 1, bias ← 0.
  virtual void reset() = 0;
};

class LayerNorm final : public Norm {
 public:
  // weight (dim); bias (dim) when `bias`.
  // Weight and bias are used through ctx.linear->replicated_param (layers/build_context.h).
  LayerNorm(int64_t dim, double eps, bool bias = true, DType dtype = DType::kF32,
            Device device = {}, const LayerContext& ctx = {});
  Tensor forward(const Tensor& x) const override;
  void reset() override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  double eps_;
  std::shared_ptr<const LinearFactory> linear_;  // for replicated_param
  Tensor weight_, bias_;
};

class RMSNorm final : public Norm {
 public:
  // per_head: over each attention head's dim of this rank's heads (Qwen3's q/k norms), its
  // weight used through ctx.linear->head_param, else replicated_param.
  RMSNorm(int64_t dim, double eps, DType dtype = DType::kF32, Device device = {},
          const LayerContext& ctx = {}, bool per_head = false);
  Tensor forward(const Tensor& x) const override;
  void reset() override;
  const Tensor& weight() const { return weight_; }

 private:
  double eps_;
  std::shared_ptr<const LinearFactory> linear_;  // for replicated_param / head_param
  bool per_head_;
  Tensor weight_;
};

}  // namespace loom
