// layers/mlp.cpp — Mlp and SwiGluMlp (see layers/mlp.h).
#include "layers/mlp.h"

#include "core/ops/activation.h"
#include "core/ops/matmul.h"

namespace loom {

namespace {

// An input projection (column-parallel under a ModelParallel) and an output projection (row).
std::unique_ptr<LinearLayer> in_proj(int64_t in, int64_t out, bool bias, DType dtype, Device device,
                                     const ModelParallel* mp) {
  if (mp) return mp->column_linear(in, {out}, bias, dtype, device);
  return std::make_unique<Linear>(in, out, bias, dtype, device);
}

std::unique_ptr<LinearLayer> out_proj(int64_t in, int64_t out, bool bias, DType dtype,
                                      Device device, const ModelParallel* mp) {
  if (mp) return mp->row_linear(in, out, bias, dtype, device);
  return std::make_unique<Linear>(in, out, bias, dtype, device);
}

}  // namespace

Mlp::Mlp(int64_t dim, int64_t hidden, bool bias, DType dtype, Device device,
         const ModelParallel* mp)
    : fc_(in_proj(dim, hidden, bias, dtype, device, mp)),
      proj_(out_proj(hidden, dim, bias, dtype, device, mp)),
      fused_(bias && mp == nullptr) {
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

SwiGluMlp::SwiGluMlp(int64_t dim, int64_t hidden, DType dtype, Device device,
                     const ModelParallel* mp)
    : gate_(in_proj(dim, hidden, false, dtype, device, mp)),
      up_(in_proj(dim, hidden, false, dtype, device, mp)),
      down_(out_proj(hidden, dim, false, dtype, device, mp)) {
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
