// optim/sgd.h — SGD with momentum, optional Nesterov, and (coupled, L2-style) weight decay on
// parameters whose ParamRef::decay is set. Built from the element-wise kernels (scale, axpy);
// no kernel of its own. State: one momentum buffer per parameter when momentum > 0.
#pragma once

#include "optim/optimizer.h"

namespace loom::optim {

// Per parameter p with gradient g (PyTorch's torch.optim.SGD with dampening 0):
//   d   = g + weight_decay · p          (weight_decay only where ParamRef::decay)
//   buf = momentum · buf + d            (buf starts at zero, so the first step gives buf = d)
//   d   = nesterov ? d + momentum · buf : buf      (only when momentum > 0)
//   p  -= lr · d
class SGD : public Optimizer {
 public:
  // momentum in [0, 1); weight_decay >= 0; nesterov needs momentum > 0.
  SGD(std::vector<ParamRef> params, double momentum, double weight_decay, bool nesterov = false);

  void step(double lr) override;
  // "momentum_buffer.<name>" per parameter when momentum > 0, else nothing. See
  // Note [Optimizer state contract] in optim/optimizer.h.
  std::vector<std::pair<std::string, Tensor>> state_tensors() override;

  double momentum() const { return momentum_; }
  double weight_decay() const { return weight_decay_; }
  bool nesterov() const { return nesterov_; }

 private:
  double momentum_, weight_decay_;
  bool nesterov_;
  std::vector<Tensor> momentum_buffer_;  // one per parameter (empty when momentum is 0)
};

}  // namespace loom::optim
