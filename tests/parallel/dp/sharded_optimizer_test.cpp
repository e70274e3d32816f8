// tests/parallel/dp/sharded_optimizer_test.cpp — ShardedOptimizer (parallel/dp/sharded_optimizer.h)
// in one process: it wraps whichever optimizer the factory makes over 1-d pieces of a flat
// buffer, binds each piece's gradient view before the inner step, runs after_step once per step,
// and passes the inner optimizer's state and step count through; the pieces end exactly where
// the inner optimizer over the same pieces ends.
#include "parallel/dp/sharded_optimizer.h"

#include <gtest/gtest.h>

#include "core/rng.h"
#include "optim/adamw.h"
#include "optim/sgd.h"

namespace loom::parallel::dp {
namespace {

TEST(ShardedOptimizer, WrapsAnyInnerOptimizerOverThePieces) {
  for (const std::string name : {"sgd", "adamw"}) {
    const optim::OptimizerFactory factory =
        [&](std::vector<optim::ParamRef> refs) -> std::unique_ptr<optim::Optimizer> {
      if (name == "sgd") return std::make_unique<optim::SGD>(std::move(refs), 0.9, 0.1);
      return std::make_unique<optim::AdamW>(std::move(refs), 0.9, 0.95, 1e-8, 0.1);
    };
    Generator gen(3);
    Tensor flat = randn({10}, gen);        // the owned range of a flat parameter buffer
    Tensor grad_flat = randn({10}, gen);   // its reduced gradient
    Tensor reference = flat.clone();       // the same pieces under the plain inner optimizer
    auto pieces = [](const Tensor& buf) {  // "a[0:4]" and "b[0:6]": two parameters' pieces
      return std::vector<optim::ParamRef>{{"a[0:4]", buf.narrow(0, 0, 4), true},
                                          {"b[0:6]", buf.narrow(0, 4, 6), false}};
    };
    int after = 0;
    ShardedOptimizer opt(
        pieces(flat), factory,
        [&](size_t k) { return k == 0 ? grad_flat.narrow(0, 0, 4) : grad_flat.narrow(0, 4, 6); },
        [&] { ++after; });
    std::unique_ptr<optim::Optimizer> plain = factory(pieces(reference));
    for (int step = 0; step < 3; ++step) {
      opt.step(0.1);
      Tensor a = plain->params()[0].param, b = plain->params()[1].param;  // handles
      a.set_grad(grad_flat.narrow(0, 0, 4).clone());
      b.set_grad(grad_flat.narrow(0, 4, 6).clone());
      plain->step(0.1);
    }
    EXPECT_EQ(after, 3) << name;
    EXPECT_EQ(opt.step_count(), plain->step_count()) << name;
    EXPECT_EQ(flat.to_vector(), reference.to_vector()) << name;
    EXPECT_EQ(opt.params().size(), 2u);
    EXPECT_EQ(opt.state_tensors().size(), plain->state_tensors().size()) << name;
    opt.set_step_count(7);
    EXPECT_EQ(opt.inner().step_count(), 7) << name;
  }
}

}  // namespace
}  // namespace loom::parallel::dp
