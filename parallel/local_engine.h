// parallel/local_engine.h — LocalEngine: the GradientEngine (parallel/engine.h) of a rank that
// shares no gradient with another: one process, or tensor/context/pipeline parallelism without
// data parallelism (the norm still sums over the other ranks' parts, from placements). The
// optimizer (made by the config's factory) steps the trained parameters as they are.
#pragma once

#include <memory>

#include "optim/optimizer.h"
#include "parallel/engine.h"

namespace loom::parallel {

class LocalEngine final : public GradientEngine {
 public:
  // params: the parameters this rank trains, in the optimizer's order.
  LocalEngine(NamedTensors params, std::unique_ptr<optim::Optimizer> optimizer);

  void zero_grad() override { optimizer_->zero_grad(); }
  void step(double lr, const Tensor& factor) override { optimizer_->step_scaled(lr, factor); }
  std::vector<HeldPiece> trained_pieces() const override;
  std::vector<HeldPiece> held_parameters() const override { return trained_pieces(); }
  NamedTensors optimizer_state() override { return optimizer_->state_tensors(); }
  int64_t optimizer_steps() const override { return optimizer_->step_count(); }
  void set_optimizer_steps(int64_t n) override { optimizer_->set_step_count(n); }
  std::string describe() const override { return ""; }

 protected:
  void sync() override {}
  std::vector<HeldPiece> gradients() override;
  Tensor local_grad_sum_squares() override;

 private:
  NamedTensors params_;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace loom::parallel
