// optim/adamw.h — AdamW (Loshchilov & Hutter): Adam with bias correction and decoupled weight
// decay, applied only to parameters whose ParamRef::decay is set. Updated by the fused
// multi-tensor kernel (kernels/adamw.h) when all parameters share a device and a dtype, else by
// one fused kernel per parameter (the same bits). State is kept in the parameter's dtype: f32
// for f32 master weights, f64 for f64 parameters (tests). No schedule, no clipping here.
#pragma once

#include "optim/optimizer.h"

namespace loom::optim {

class AdamW : public Optimizer {
 public:
  // beta1, beta2 in [0, 1); eps > 0; weight_decay >= 0 (the decoupled factor: each step
  // multiplies a decaying parameter by 1 - lr · weight_decay).
  AdamW(std::vector<ParamRef> params, double beta1, double beta2, double eps, double weight_decay);

  void step(double lr) override { step_scaled(lr, Tensor()); }
  // The factor and the step count go into the multi-tensor update (no host read, .grad not
  // written; a non-finite factor skips it there) when all parameters share a device and a
  // dtype; otherwise the factor is read on the host as the default does.
  void step_scaled(double lr, const Tensor& grad_scale) override;
  // The count lives on the first parameter's device (steps_): reading it is a host read.
  int64_t step_count() const override;
  void set_step_count(int64_t step) override;
  // "exp_avg.<name>" and "exp_avg_sq.<name>" per parameter, in parameter order. See
  // Note [Optimizer state contract] in optim/optimizer.h.
  std::vector<std::pair<std::string, Tensor>> state_tensors() override;

  double beta1() const { return beta1_; }
  double beta2() const { return beta2_; }
  double eps() const { return eps_; }
  double weight_decay() const { return weight_decay_; }

 private:
  double beta1_, beta2_, eps_, weight_decay_;
  std::vector<Tensor> exp_avg_;     // one per parameter, its shape/dtype/device
  std::vector<Tensor> exp_avg_sq_;  // one per parameter, its shape/dtype/device
  // Updates made, a 0-d f64 tensor on the first parameter's device (the CPU without parameters):
  // read and advanced by the update where it runs, so a step skipped on the device is not counted
  // (kernels::AdamWOptions::step_count). Replaces Optimizer::step_count_.
  Tensor steps_;
};

}  // namespace loom::optim
