// optim/sgd.cpp — SGD with momentum: each update is a few in-place scale/axpy kernel calls.
#include "optim/sgd.h"

#include <cmath>

#include "core/ops/elementwise.h"
#include "kernels/elementwise.h"
#include "optim/grad_input.h"

namespace loom::optim {

SGD::SGD(std::vector<ParamRef> params, double momentum, double weight_decay, bool nesterov)
    : Optimizer(std::move(params)),
      momentum_(momentum),
      weight_decay_(weight_decay),
      nesterov_(nesterov) {
  LOOM_CHECK(momentum >= 0 && momentum < 1, "sgd: momentum must be in [0, 1), got ", momentum);
  LOOM_CHECK(weight_decay >= 0, "sgd: weight_decay must be >= 0, got ", weight_decay);
  LOOM_CHECK(!nesterov || momentum > 0, "sgd: nesterov needs momentum > 0");
  if (momentum > 0) {
    for (const ParamRef& p : params_) momentum_buffer_.push_back(Tensor::zeros_like(p.param));
  }
}

void SGD::step(double lr) {
  LOOM_CHECK(std::isfinite(lr) && lr >= 0, "sgd: learning rate must be finite and >= 0, got ", lr);
  ++step_count_;
  for (size_t i = 0; i < params_.size(); ++i) {
    ParamRef& p = params_[i];
    Tensor d = detail::grad_for_update(p, "sgd");
    if (!d.defined() || p.param.numel() == 0) continue;
    bool owned = false;  // d may be the gradient itself, which is never modified
    if (p.decay && weight_decay_ > 0) {
      d = d.clone();
      owned = true;
      ops::add_(d, p.param.detach(), weight_decay_);
    }
    if (momentum_ > 0) {
      Tensor& buf = momentum_buffer_[i];
      kernels::call_kernel<kernels::scale_forward_k>(buf, momentum_, buf);
      ops::add_(buf, d, 1.0);
      if (nesterov_) {
        if (!owned) d = d.clone();
        ops::add_(d, buf, momentum_);
      } else {
        d = buf;
      }
    }
    ops::add_(p.param, d, -lr);
  }
}

std::vector<std::pair<std::string, Tensor>> SGD::state_tensors() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < momentum_buffer_.size(); ++i) {
    out.emplace_back("momentum_buffer." + params_[i].name, momentum_buffer_[i]);
  }
  return out;
}

}  // namespace loom::optim
