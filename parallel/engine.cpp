// parallel/engine.cpp — GradientEngine::finish, the one order of a step's end (Note [Engine
// step] in parallel/engine.h).
#include "parallel/engine.h"

#include "parallel/gradients.h"

namespace loom::parallel {

Tensor GradientEngine::finish() {
  sync();
  const std::vector<HeldPiece> grads = gradients();  // views: the exchange writes through them
  if (exchange_) {
    const std::vector<HeldPiece> other = exchange_gradients();
    exchange_(other.empty() ? grads : other);
  }
  return global_grad_sq_sum(grads, ctx_, device_);
}

}  // namespace loom::parallel
