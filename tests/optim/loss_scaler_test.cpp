// tests/optim/loss_scaler_test.cpp — dynamic loss scaling on the CPU with f32 gradients: the
// scaled backward then unscale gives the plain gradients exactly (powers of two), injected inf
// and NaN skip the step, leave the gradients alone and halve the scale, growth after the
// interval, the floor, and the saved state.
#include "optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/rng.h"
#include "optim/clip.h"

namespace loom {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(LossScaler, ScalesArePowersOfTwo) {
  EXPECT_EQ(optim::LossScaler(65536.0).scale(), 65536.0);
  EXPECT_EQ(optim::LossScaler(1000.0).scale(), 512.0);
  EXPECT_EQ(optim::LossScaler(1.0).scale(), 1.0);
  EXPECT_THROW(optim::LossScaler{0.5}, Error);
  EXPECT_THROW(optim::LossScaler{kInf}, Error);
  EXPECT_THROW((optim::LossScaler{1024.0, 0}), Error);
}

TEST(LossScaler, ScaledBackwardThenUnscaleGivesThePlainGradients) {
  Generator gen(21);
  const Tensor x = randn({7, 13}, gen);
  const Tensor y = randn({13}, gen);
  auto grads_of = [&](const optim::LossScaler* scaler) {
    Tensor w = randn({7, 13}, gen, DType::kF32);
    Tensor b = randn({13}, gen, DType::kF32);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    const Tensor loss = ops::sum(ops::mul(ops::add(ops::mul(w, x), b), y));
    autograd::backward(scaler ? scaler->scale_loss(loss) : loss);
    return std::vector<Tensor>{w.grad(), b.grad()};
  };
  const Generator start = gen;
  const std::vector<Tensor> plain = grads_of(nullptr);
  gen = start;  // the same parameters again
  optim::LossScaler scaler(4096.0, 100);
  const std::vector<Tensor> g = grads_of(&scaler);
  for (size_t i = 0; i < g.size(); ++i) {
    const std::vector<double> want = plain[i].to_vector(), got = g[i].to_vector();
    for (size_t j = 0; j < want.size(); ++j)
      ASSERT_EQ(got[j], want[j] * 4096.0) << "tensor " << i << " element " << j;
  }
  const double scaled_norm = optim::global_grad_norm(g);
  const double norm = scaler.unscale_(g, scaled_norm);
  EXPECT_DOUBLE_EQ(norm, optim::global_grad_norm(plain));
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_EQ(g[i].to_vector(), plain[i].to_vector()) << "tensor " << i;
  EXPECT_TRUE(scaler.update(norm));
  EXPECT_EQ(scaler.scale(), 4096.0);
  EXPECT_EQ(scaler.state().good_steps, 1);
}

TEST(LossScaler, InjectedInfOrNanSkipsTheStepAndHalvesTheScale) {
  for (const float bad :
       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    optim::LossScaler scaler(1024.0, 3);
    ASSERT_TRUE(scaler.update(1.0));  // one good step, then the overflow resets the count
    Generator gen(5);
    std::vector<Tensor> g = {randn({40}, gen),
                             Tensor::from_vector(std::vector<float>{1.5f, bad, -2.0f}, {3})};
    const std::vector<double> before = g[0].to_vector();
    const double norm = scaler.unscale_(g, optim::global_grad_norm(g));
    EXPECT_FALSE(std::isfinite(norm)) << bad;
    EXPECT_EQ(g[0].to_vector(), before) << "an overflowed step must leave the gradients alone";
    EXPECT_EQ(g[1].to_vector()[0], 1.5);
    EXPECT_FALSE(scaler.update(norm)) << bad;
    EXPECT_EQ(scaler.scale(), 512.0);
    EXPECT_EQ(scaler.state().good_steps, 0);
    EXPECT_EQ(scaler.state().skipped_steps, 1);
  }
}

TEST(LossScaler, GrowsAfterTheIntervalAndStopsAtTheFloor) {
  optim::LossScaler scaler(8.0, 3);
  EXPECT_TRUE(scaler.update(2.0));
  EXPECT_TRUE(scaler.update(2.0));
  EXPECT_EQ(scaler.scale(), 8.0);
  EXPECT_TRUE(scaler.update(2.0));
  EXPECT_EQ(scaler.scale(), 16.0);  // three good steps in a row
  EXPECT_EQ(scaler.state().good_steps, 0);
  EXPECT_TRUE(scaler.update(2.0));
  EXPECT_TRUE(scaler.update(2.0));
  EXPECT_FALSE(scaler.update(kInf));  // interrupts the run of good steps
  EXPECT_EQ(scaler.scale(), 8.0);
  EXPECT_TRUE(scaler.update(2.0));
  EXPECT_TRUE(scaler.update(2.0));
  EXPECT_EQ(scaler.scale(), 8.0);
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(scaler.update(std::nan("")));
  EXPECT_EQ(scaler.scale(), optim::LossScaler::kMinScale);
  EXPECT_EQ(scaler.state().skipped_steps, 11);
}

TEST(LossScaler, StateRoundTripsAndIsChecked) {
  optim::LossScaler a(256.0, 4);
  a.update(kInf);
  a.update(1.0);
  optim::LossScaler b(65536.0, 4);
  b.set_state(a.state());
  EXPECT_EQ(b.scale(), 128.0);
  EXPECT_EQ(b.state().good_steps, 1);
  EXPECT_EQ(b.state().skipped_steps, 1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.update(1.0), b.update(1.0));
  EXPECT_EQ(a.scale(), b.scale());
  EXPECT_EQ(b.scale(), 256.0);
  EXPECT_THROW(b.set_state({100.0, 0, 0}), Error);
  EXPECT_THROW(b.set_state({0.25, 0, 0}), Error);
  EXPECT_THROW(b.set_state({64.0, -1, 0}), Error);
}

}  // namespace
}  // namespace loom
