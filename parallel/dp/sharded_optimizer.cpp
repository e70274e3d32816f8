// parallel/dp/sharded_optimizer.cpp — ShardedOptimizer (see parallel/dp/sharded_optimizer.h).
#include "parallel/dp/sharded_optimizer.h"

#include "core/error.h"

namespace loom::parallel::dp {

ShardedOptimizer::ShardedOptimizer(std::vector<optim::ParamRef> pieces,
                                   const optim::OptimizerFactory& inner,
                                   std::function<Tensor(size_t k)> grad_of,
                                   std::function<void()> after_step)
    : Optimizer(pieces),
      inner_(inner(std::move(pieces))),
      grad_of_(std::move(grad_of)),
      after_step_(std::move(after_step)) {
  LOOM_CHECK(inner_ != nullptr, "ShardedOptimizer: the optimizer factory made no optimizer");
}

void ShardedOptimizer::step_scaled(double lr, const Tensor& grad_scale) {
  const std::vector<optim::ParamRef>& refs = inner_->params();
  for (size_t k = 0; k < refs.size(); ++k) {
    Tensor param = refs[k].param;
    param.set_grad(grad_of_(k));
  }
  inner_->step_scaled(lr, grad_scale);
  if (after_step_) after_step_();
}

}  // namespace loom::parallel::dp
