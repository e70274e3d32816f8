// parallel/diloco/outer_optimizer.h — DiLoCo's outer optimizer: SGD with momentum (optionally
// Nesterov) over one range of n f32 elements in host memory. Pure host arithmetic: it neither
// communicates nor touches a device; the caller averages the pseudo-gradient across islands and
// copies the new outer weights back into the model.
//
// Note [Outer step]: the pseudo-gradient is g = outer − inner (the outer weights at the start of
// the round minus an island's inner weights at its end), averaged over the islands, so it points
// the way a gradient does and the update subtracts it: w ← w − lr·d. With lr 1 and momentum 0
// the new outer weights are w − mean_k(w − inner_k) = mean_k(inner_k): plain parameter
// averaging (local SGD). DiLoCo's defaults are lr 0.7, momentum 0.9, Nesterov (Douillard et al.
// 2023, "DiLoCo: Distributed Low-Communication Training of Language Models", arXiv 2311.08105).
#pragma once

#include <cstdint>
#include <vector>

namespace loom::parallel::diloco {

struct OuterOptions {
  double lr = 0.7;        // finite, >= 0
  double momentum = 0.9;  // in [0, 1); 0: no momentum buffer
  bool nesterov = true;   // ignored when momentum is 0 (Nesterov with μ = 0 is plain SGD)
};

// Per element, with g the averaged pseudo-gradient (torch.optim.SGD, dampening 0):
//   buf = μ·buf + g                      (buf starts at zero)
//   d   = nesterov ? g + μ·buf : buf      (μ = 0: d = g, and no buffer is kept)
//   w  -= lr·d
// Storage is f32; each element's arithmetic is done in double, every a·b + c a fused multiply-add,
// and every stored value (buf, w) is rounded to f32 once (d uses the unrounded buf): the same
// bits on every machine, as the islands' copies of the outer weights must be.
class OuterOptimizer {
 public:
  OuterOptimizer(OuterOptions o, int64_t n);

  // The outer weights (n, zeros at construction: the caller fills them) and the momentum buffer
  // (n, zeros; empty when momentum is 0). Both are state to checkpoint.
  std::vector<float>& weights() { return weights_; }
  const std::vector<float>& weights() const { return weights_; }
  std::vector<float>& momentum() { return momentum_; }
  const std::vector<float>& momentum() const { return momentum_; }

  // One outer step with g (n), the pseudo-gradient averaged over islands; counts the step.
  void step(const float* g);

  // The number of outer steps taken (restored from a checkpoint with set_steps).
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps);

  const OuterOptions& options() const { return options_; }
  int64_t size() const { return n_; }

 private:
  OuterOptions options_;
  int64_t n_;
  int64_t steps_ = 0;
  std::vector<float> weights_;   // (n)
  std::vector<float> momentum_;  // (n), or empty when options_.momentum is 0
};

}  // namespace loom::parallel::diloco
