// layers/mlp.h — the position-wise feed-forward layers behind one FeedForward interface:
// Mlp (GPT-2: fc → GELU-tanh → proj, with biases; one fused op, ops::gelu_mlp, on one device)
// and SwiGluMlp (Llama: down(silu(gate·x) ⊙ up·x), biases optional).
#pragma once

#include <cstdint>
#include <memory>

#include "core/rng.h"
#include "core/tensor.h"
#include "layers/build_context.h"
#include "layers/module.h"

namespace loom {

class FeedForward : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;  // x (…, C) → (…, C)
  // Input projections ← N(0, std²), the output projection ← N(0, out_std²), biases ← 0.
  virtual void init(Generator& gen, double std, double out_std) = 0;
};

class Mlp final : public FeedForward {
 public:
  // fc and proj: ctx.linear's mlp_in and mlp_out for block `layer` (layers/build_context.h).
  Mlp(int64_t dim, int64_t hidden, bool bias = true, DType dtype = DType::kF32, Device device = {},
      const LayerContext& ctx = {}, int64_t layer = 0);
  Tensor forward(const Tensor& x) const override;
  void init(Generator& gen, double std, double out_std) override;
  const LinearLayer& fc() const { return *fc_; }
  const LinearLayer& proj() const { return *proj_; }

 private:
  std::unique_ptr<LinearLayer> fc_;    // hidden × dim
  std::unique_ptr<LinearLayer> proj_;  // dim × hidden
  // Plain layers (LinearLayer::plain) with biases: forward runs as one ops::gelu_mlp (fused
  // epilogues in both directions). Split layers communicate, so they run one by one.
  bool fused_;
};

class SwiGluMlp final : public FeedForward {
 public:
  // gate and up: ctx.linear's mlp_in, down its mlp_out, for block `layer`; biases on all three
  // with `bias` (Llama's mlp_bias).
  SwiGluMlp(int64_t dim, int64_t hidden, bool bias = false, DType dtype = DType::kF32,
            Device device = {}, const LayerContext& ctx = {}, int64_t layer = 0);
  Tensor forward(const Tensor& x) const override;
  void init(Generator& gen, double std, double out_std) override;

 private:
  std::unique_ptr<LinearLayer> gate_;  // hidden × dim
  std::unique_ptr<LinearLayer> up_;    // hidden × dim
  std::unique_ptr<LinearLayer> down_;  // dim × hidden
};

}  // namespace loom
