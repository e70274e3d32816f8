// optim/optimizer.cpp — the parts of the optimiser interface shared by every optimiser:
// parameter validation, zero_grad, the step counter and the default scaled step.
#include "optim/optimizer.h"

#include <cmath>
#include <set>

#include "optim/clip.h"

namespace loom::optim {

Optimizer::Optimizer(std::vector<ParamRef> params) : params_(std::move(params)) {
  std::set<std::string> seen;
  for (const ParamRef& p : params_) {
    LOOM_CHECK(p.param.defined(), "optimizer: parameter '", p.name, "' is undefined");
    LOOM_CHECK(seen.insert(p.name).second, "optimizer: parameter name '", p.name,
               "' appears twice");
    LOOM_CHECK(p.param.is_contiguous(), "optimizer: parameter '", p.name, "' must be contiguous");
    LOOM_CHECK(p.param.dtype() == DType::kF32 || p.param.dtype() == DType::kF64,
               "optimizer: parameter '", p.name, "' is ", dtype_name(p.param.dtype()),
               "; optimisers update f32 (master) or f64 parameters");
  }
}

void Optimizer::zero_grad() {
  for (ParamRef& p : params_) p.param.zero_grad();
}

void Optimizer::step_scaled(double lr, const Tensor& grad_scale) {
  if (grad_scale.defined()) {
    const double factor = grad_scale.item();
    if (!std::isfinite(factor)) return;  // an overflowed step: skipped, not counted
    std::vector<Tensor> grads;
    for (const ParamRef& p : params_) {
      if (p.param.grad().defined()) grads.push_back(p.param.grad());
    }
    scale_grads(grads, factor);
  }
  step(lr);
}

void Optimizer::set_step_count(int64_t step) {
  LOOM_CHECK(step >= 0, "optimizer: step count must be >= 0, got ", step);
  step_count_ = step;
}

}  // namespace loom::optim
