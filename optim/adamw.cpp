// optim/adamw.cpp — AdamW: argument checks, eager state allocation, and the per-parameter call
// to the fused adamw_step kernel.
#include "optim/adamw.h"

#include <cmath>

#include "kernels/adamw.h"
#include "optim/grad_input.h"

namespace loom::optim {

AdamW::AdamW(std::vector<ParamRef> params, double beta1, double beta2, double eps,
             double weight_decay)
    : Optimizer(std::move(params)),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      weight_decay_(weight_decay) {
  LOOM_CHECK(beta1 >= 0 && beta1 < 1, "adamw: beta1 must be in [0, 1), got ", beta1);
  LOOM_CHECK(beta2 >= 0 && beta2 < 1, "adamw: beta2 must be in [0, 1), got ", beta2);
  LOOM_CHECK(eps > 0, "adamw: eps must be > 0, got ", eps);
  LOOM_CHECK(weight_decay >= 0, "adamw: weight_decay must be >= 0, got ", weight_decay);
  // Allocated now (not at the first step) so a checkpoint can be loaded into them.
  for (const ParamRef& p : params_) {
    exp_avg_.push_back(Tensor::zeros_like(p.param));
    exp_avg_sq_.push_back(Tensor::zeros_like(p.param));
  }
}

void AdamW::step(double lr) {
  LOOM_CHECK(std::isfinite(lr) && lr >= 0, "adamw: learning rate must be finite and >= 0, got ",
             lr);
  ++step_count_;
  for (size_t i = 0; i < params_.size(); ++i) {
    ParamRef& p = params_[i];
    const Tensor g = detail::grad_for_update(p, "adamw");
    if (!g.defined() || p.param.numel() == 0) continue;
    const double wd = p.decay ? weight_decay_ : 0.0;
    kernels::call_kernel<kernels::adamw_step_k>(p.param, g, exp_avg_[i], exp_avg_sq_[i], lr,
                                                beta1_, beta2_, eps_, wd, step_count_);
  }
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_tensors() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back("exp_avg." + params_[i].name, exp_avg_[i]);
    out.emplace_back("exp_avg_sq." + params_[i].name, exp_avg_sq_[i]);
  }
  return out;
}

}  // namespace loom::optim
