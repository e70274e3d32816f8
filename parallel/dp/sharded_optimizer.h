// parallel/dp/sharded_optimizer.h — ShardedOptimizer: ZeRO's optimizer, wrapping any inner
// optim::Optimizer (AdamW, SGD, a fork's) built by a factory over the pieces of the parameters
// this rank owns — 1-d views of the flat parameter buffers named "<param>[<begin>:<end>]"
// (element offsets in the flattened parameter) — so optimizer state exists for the owned shard
// only (Megatron's distributed optimizer, DeepSpeed's ZeRO-1/2). A step points each piece's
// .grad at its slice of the reduced gradient, runs the inner step (the factor, the skip of a
// non-finite one and the step count are the inner optimizer's), then calls `after_step` (the
// all-gather of the updated shards at stages 1-2; nothing at stage 3, whose next forward gathers
// per unit). It owns no buffers and does no communication itself.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "optim/optimizer.h"

namespace loom::parallel::dp {

class ShardedOptimizer final : public optim::Optimizer {
 public:
  // pieces: the owned views, with their decay flags. grad_of(k): piece k's gradient view, valid
  // once the gradients are synchronised. after_step: run after every inner step (taken or not).
  ShardedOptimizer(std::vector<optim::ParamRef> pieces, const optim::OptimizerFactory& inner,
                   std::function<Tensor(size_t k)> grad_of, std::function<void()> after_step);

  void step(double lr) override { step_scaled(lr, Tensor()); }
  void step_scaled(double lr, const Tensor& grad_scale) override;
  void zero_grad() override {}  // the gradients live in the data-parallel buckets
  std::vector<std::pair<std::string, Tensor>> state_tensors() override {
    return inner_->state_tensors();
  }
  int64_t step_count() const override { return inner_->step_count(); }
  void set_step_count(int64_t step) override { inner_->set_step_count(step); }
  optim::Optimizer& inner() { return *inner_; }

 private:
  std::unique_ptr<optim::Optimizer> inner_;
  std::function<Tensor(size_t)> grad_of_;
  std::function<void()> after_step_;
};

}  // namespace loom::parallel::dp
