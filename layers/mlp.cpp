// layers/mlp.cpp — Mlp and SwiGluMlp (see layers/mlp.h).
#include "layers/mlp.h"

#include "core/ops/activation.h"

namespace loom {

Mlp::Mlp(int64_t dim, int64_t hidden, bool bias, DType dtype, Device device)
    : fc_(dim, hidden, bias, dtype, device), proj_(hidden, dim, bias, dtype, device) {
  register_module("fc", fc_);
  register_module("proj", proj_);
}

Tensor Mlp::forward(const Tensor& x) const { return proj_.forward(ops::gelu(fc_.forward(x))); }

void Mlp::init(Generator& gen, double std, double out_std) {
  fc_.init(gen, std);
  proj_.init(gen, out_std);
}

SwiGluMlp::SwiGluMlp(int64_t dim, int64_t hidden, DType dtype, Device device)
    : gate_(dim, hidden, false, dtype, device),
      up_(dim, hidden, false, dtype, device),
      down_(hidden, dim, false, dtype, device) {
  register_module("gate", gate_);
  register_module("up", up_);
  register_module("down", down_);
}

Tensor SwiGluMlp::forward(const Tensor& x) const {
  return down_.forward(ops::swiglu(gate_.forward(x), up_.forward(x)));
}

void SwiGluMlp::init(Generator& gen, double std, double out_std) {
  gate_.init(gen, std);
  up_.init(gen, std);
  down_.init(gen, out_std);
}

}  // namespace loom
