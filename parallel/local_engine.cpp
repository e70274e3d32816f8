// parallel/local_engine.cpp — the optimizer alone behind the engine seam (see the header).
#include "parallel/local_engine.h"

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "parallel/gradients.h"

namespace loom::parallel {

LocalEngine::LocalEngine(NamedTensors params, std::unique_ptr<optim::Optimizer> optimizer)
    : params_(std::move(params)), optimizer_(std::move(optimizer)) {}

std::vector<HeldPiece> LocalEngine::trained_pieces() const {
  std::vector<HeldPiece> out;
  for (const auto& [name, p] : params_) out.push_back(held_whole(name, p));
  return out;
}

std::vector<HeldPiece> LocalEngine::gradients() { return parameter_grad_pieces(params_); }

Tensor LocalEngine::local_grad_sum_squares() {
  autograd::NoGradGuard no_grad;
  Tensor sum;
  for (const auto& [name, p] : params_) {
    if (!p.grad().defined()) continue;
    const Tensor s = ops::sum_squares(p.grad());
    sum = sum.defined() ? ops::add(sum, s) : s;
  }
  return sum;
}

}  // namespace loom::parallel
