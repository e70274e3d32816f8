// parallel/engine.cpp — GradientEngine::finish, the one order of a step's end (Note [Engine
// step] in parallel/engine.h).
#include "parallel/engine.h"

#include "parallel/gradients.h"

namespace loom::parallel {

Tensor GradientEngine::finish() {
  sync();
  if (exchange_) exchange_(exchange_gradients());
  return global_grad_sq_sum(gradients(), ctx_, device_);
}

}  // namespace loom::parallel
