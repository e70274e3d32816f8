// parallel/diloco/outer_optimizer.cpp — the outer SGD step, element by element in double
// (Note [Outer step] in parallel/diloco/outer_optimizer.h). Every element is independent, so the
// result does not depend on the number of threads; the multiply-adds are explicit std::fma, which
// the compiler may not split or fuse otherwise (it would contract a·b + c into an FMA where the
// ISA has one), so every machine computes the same bits.
#include "parallel/diloco/outer_optimizer.h"

#include <cmath>

#include "core/error.h"

namespace loom::parallel::diloco {

namespace {
constexpr int64_t kParallelMin = 1 << 15;  // below this, one thread
}  // namespace

OuterOptimizer::OuterOptimizer(OuterOptions o, int64_t n) : options_(o), n_(n) {
  LOOM_CHECK(std::isfinite(o.lr) && o.lr >= 0, "diloco outer: lr must be finite and >= 0, got ",
             o.lr);
  LOOM_CHECK(o.momentum >= 0 && o.momentum < 1, "diloco outer: momentum must be in [0, 1), got ",
             o.momentum);
  LOOM_CHECK(n >= 0, "diloco outer: size must be >= 0, got ", n);
  weights_.assign(static_cast<size_t>(n), 0.0f);
  if (o.momentum > 0) momentum_.assign(static_cast<size_t>(n), 0.0f);
}

void OuterOptimizer::set_steps(int64_t steps) {
  LOOM_CHECK(steps >= 0, "diloco outer: step count must be >= 0, got ", steps);
  steps_ = steps;
}

void OuterOptimizer::step(const float* g) {
  LOOM_CHECK(static_cast<int64_t>(weights_.size()) == n_, "diloco outer: weights hold ",
             weights_.size(), " elements, expected ", n_);
  const double lr = options_.lr, mu = options_.momentum;
  float* w = weights_.data();
  if (mu > 0) {
    LOOM_CHECK(static_cast<int64_t>(momentum_.size()) == n_, "diloco outer: momentum holds ",
               momentum_.size(), " elements, expected ", n_);
    float* buf = momentum_.data();
    const bool nesterov = options_.nesterov;
#pragma omp parallel for schedule(static) if (n_ >= kParallelMin)
    for (int64_t i = 0; i < n_; ++i) {
      const double gi = g[i];
      const double b = std::fma(mu, static_cast<double>(buf[i]), gi);
      const double d = nesterov ? std::fma(mu, b, gi) : b;
      buf[i] = static_cast<float>(b);
      w[i] = static_cast<float>(std::fma(-lr, d, static_cast<double>(w[i])));
    }
  } else {
#pragma omp parallel for schedule(static) if (n_ >= kParallelMin)
    for (int64_t i = 0; i < n_; ++i) {
      w[i] =
          static_cast<float>(std::fma(-lr, static_cast<double>(g[i]), static_cast<double>(w[i])));
    }
  }
  ++steps_;
}

}  // namespace loom::parallel::diloco
