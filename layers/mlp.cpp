// layers/mlp.cpp — Mlp and SwiGluMlp (see layers/mlp.h).
#include "layers/mlp.h"

#include "core/ops/activation.h"
#include "core/ops/matmul.h"

namespace loom {

Mlp::Mlp(int64_t dim, int64_t hidden, bool bias, DType dtype, Device device,
         const LayerContext& ctx, int64_t layer)
    : fc_(ctx.linear->mlp_in(layer, dim, hidden, bias, dtype, device)),
      proj_(ctx.linear->mlp_out(layer, hidden, dim, bias, dtype, device)),
      fused_(bias && fc_->plain() && proj_->plain()) {
  register_module("fc", *fc_);
  register_module("proj", *proj_);
}

Tensor Mlp::forward(const Tensor& x) const {
  if (fused_) {  // Note [Compute dtype]: the parameters pass through compute() as in Linear
    return ops::gelu_mlp(x, compute(fc_->weight()), compute(fc_->bias()), compute(proj_->weight()),
                         compute(proj_->bias()));
  }
  return proj_->forward(ops::gelu(fc_->forward(x)));
}

void Mlp::init(Generator& gen, double std, double out_std) {
  fc_->init(gen, std);
  proj_->init(gen, out_std);
}

SwiGluMlp::SwiGluMlp(int64_t dim, int64_t hidden, bool bias, DType dtype, Device device,
                     const LayerContext& ctx, int64_t layer)
    : gate_(ctx.linear->mlp_in(layer, dim, hidden, bias, dtype, device)),
      up_(ctx.linear->mlp_in(layer, dim, hidden, bias, dtype, device)),
      down_(ctx.linear->mlp_out(layer, hidden, dim, bias, dtype, device)) {
  register_module("gate", *gate_);
  register_module("up", *up_);
  register_module("down", *down_);
}

Tensor SwiGluMlp::forward(const Tensor& x) const {
  return down_->forward(ops::swiglu(gate_->forward(x), up_->forward(x)));
}

void SwiGluMlp::init(Generator& gen, double std, double out_std) {
  gate_->init(gen, std);
  up_->init(gen, std);
  down_->init(gen, out_std);
}

}  // namespace loom
