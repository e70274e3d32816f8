// optim/adamw.cpp — AdamW: argument checks, eager state allocation, and the update: one
// adamw_multi_step call over every parameter with a gradient when they share a device and a
// dtype (one launch on CUDA; a gradient scale and the step count read inside it), else one
// adamw_step call per parameter (a gradient scale and the count read on the host first). Both
// give the same bits on the CPU.
#include "optim/adamw.h"

#include <cmath>

#include "kernels/adamw.h"
#include "optim/clip.h"
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
  steps_ = Tensor::zeros({}, DType::kF64,
                         params_.empty() ? Device::cpu() : params_.front().param.device());
}

int64_t AdamW::step_count() const { return static_cast<int64_t>(steps_.item()); }

void AdamW::set_step_count(int64_t step) {
  LOOM_CHECK(step >= 0, "optimizer: step count must be >= 0, got ", step);
  steps_ = Tensor::full({}, static_cast<double>(step), DType::kF64, steps_.device());
}

void AdamW::step_scaled(double lr, const Tensor& grad_scale) {
  LOOM_CHECK(std::isfinite(lr) && lr >= 0, "adamw: learning rate must be finite and >= 0, got ",
             lr);
  std::vector<kernels::AdamWParam> list;
  bool one_kind = true;  // one device and one dtype: a single multi-tensor call
  for (size_t i = 0; i < params_.size(); ++i) {
    ParamRef& p = params_[i];
    const Tensor g = detail::grad_for_update(p, "adamw");
    if (!g.defined() || p.param.numel() == 0) continue;
    const double wd = p.decay ? weight_decay_ : 0.0;
    list.push_back({p.param, g, exp_avg_[i], exp_avg_sq_[i], wd, Tensor()});
    one_kind = one_kind && p.param.device() == list.front().param.device() &&
               p.param.dtype() == list.front().param.dtype();
  }
  if (list.empty()) {  // nothing to update; the step still counts unless it overflowed
    if (!grad_scale.defined() || std::isfinite(grad_scale.item())) set_step_count(step_count() + 1);
    return;
  }
  if (one_kind && list.front().param.device() == steps_.device()) {
    kernels::AdamWOptions o;
    o.lr = lr;
    o.beta1 = beta1_;
    o.beta2 = beta2_;
    o.eps = eps_;
    o.step_count = steps_;
    o.grad_scale = grad_scale;
    kernels::find_kernel<kernels::adamw_multi_step_k>(list.front().param.device().type)(list, o);
    return;
  }
  if (grad_scale.defined()) {
    const double factor = grad_scale.item();
    if (!std::isfinite(factor)) return;  // skipped, not counted
    std::vector<Tensor> grads;
    for (const kernels::AdamWParam& e : list) grads.push_back(e.grad);
    scale_grads(grads, factor);
  }
  const int64_t step = step_count() + 1;
  for (kernels::AdamWParam& e : list) {
    kernels::call_kernel<kernels::adamw_step_k>(e.param, e.grad, e.exp_avg, e.exp_avg_sq, lr,
                                                beta1_, beta2_, eps_, e.weight_decay, step);
  }
  set_step_count(step);
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
