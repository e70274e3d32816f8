// tests/optim/loss_scaler_test.cpp — dynamic loss scaling on the CPU with f32 gradients: the
// scaled backward then the device factor gives the plain gradients exactly (powers of two),
// injected inf and NaN give a factor that skips the step and halve the scale, the device step
// against the host rule, growth after the interval, the floor, and the saved state (host and
// device copies).
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

// The device path on the CPU device: the loss scaled by the state's value, and the factor
// step_factor leaves there turns the scaled gradients back into the plain ones exactly.
TEST(LossScaler, ScaledBackwardThenTheDeviceFactorGivesThePlainGradients) {
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
  scaler.to(Device::cpu());
  const std::vector<Tensor> g = grads_of(&scaler);
  for (size_t i = 0; i < g.size(); ++i) {
    const std::vector<double> want = plain[i].to_vector(), got = g[i].to_vector();
    for (size_t j = 0; j < want.size(); ++j)
      ASSERT_EQ(got[j], want[j] * 4096.0) << "tensor " << i << " element " << j;
  }
  const Tensor factor = scaler.step_factor(optim::grad_sq_sum_tensor(g), 0.0);  // no clipping
  EXPECT_EQ(factor.item(), 1.0 / 4096.0);
  optim::scale_grads(g, factor.item());
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_EQ(g[i].to_vector(), plain[i].to_vector()) << "tensor " << i;
  EXPECT_EQ(scaler.device_state().to_vector(), (std::vector<double>{4096.0, 1.0, 0.0}));
  EXPECT_EQ(scaler.scale(), 4096.0);  // the host copy waits for mirror()
  EXPECT_EQ(scaler.state().good_steps, 0);
  scaler.mirror(scaler.device_state().to_vector());
  EXPECT_EQ(scaler.state().good_steps, 1);
}

// Injected inf and NaN in a gradient: the device factor is NaN (the optimizer then skips the
// step, tests/optim/adamw_test.cpp) and the device scale halves.
TEST(LossScaler, InjectedInfOrNanGivesANanFactorAndHalvesTheScale) {
  for (const float bad :
       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    optim::LossScaler scaler(1024.0, 3);
    scaler.to(Device::cpu());
    Generator gen(5);
    const std::vector<Tensor> good = {randn({40}, gen)};
    EXPECT_TRUE(std::isfinite(scaler.step_factor(optim::grad_sq_sum_tensor(good), 1.0).item()));
    const std::vector<Tensor> g = {randn({40}, gen),
                                   Tensor::from_vector(std::vector<float>{1.5f, bad, -2.0f}, {3})};
    EXPECT_TRUE(std::isnan(scaler.step_factor(optim::grad_sq_sum_tensor(g), 1.0).item())) << bad;
    // One good step, then the overflow resets the count.
    EXPECT_EQ(scaler.device_state().to_vector(), (std::vector<double>{512.0, 0.0, 1.0})) << bad;
  }
}

// loss_scale_step against the host rule (LossScaler::update) and clip_scale, step by step:
// clipping engaged and not, inf, NaN, growth after the interval, a zero norm, the floor; and
// without clipping (max_norm 0) the factor is 1/scale.
TEST(LossScaler, DeviceStepFollowsTheHostRule) {
  for (const double max_norm : {2.0, 0.0}) {
    optim::LossScaler host(8.0, 3), device(8.0, 3);
    device.to(Device::cpu());
    std::vector<double> scaled_norms = {8.0, 80.0, kInf, std::nan(""), 4.0,
                                        4.0, 4.0,  4.0,  0.0,          1e300};
    for (int i = 0; i < 6; ++i) scaled_norms.push_back(kInf);
    scaled_norms.push_back(3.0);
    for (size_t i = 0; i < scaled_norms.size(); ++i) {
      const double sq = scaled_norms[i] * scaled_norms[i];
      const double norm = std::sqrt(sq) / host.scale();
      const double want =
          std::isfinite(norm)
              ? (max_norm > 0 ? optim::clip_scale(norm, max_norm) : 1.0) / host.scale()
              : std::nan("");
      const bool took = host.update(norm);
      const double got = device.step_factor(Tensor::scalar(sq, DType::kF64), max_norm).item();
      EXPECT_EQ(std::isfinite(got), took) << "step " << i;
      if (took) {
        EXPECT_EQ(got, want) << "step " << i;
      }
      const optim::LossScalerState h = host.state();
      EXPECT_EQ(device.device_state().to_vector(),
                (std::vector<double>{h.scale, static_cast<double>(h.good_steps),
                                     static_cast<double>(h.skipped_steps)}))
          << "step " << i;
    }
    EXPECT_EQ(host.scale(), optim::LossScaler::kMinScale);  // the sequence reached the floor
  }
  optim::LossScaler s(8.0, 3);
  s.to(Device::cpu());
  EXPECT_THROW(s.step_factor(Tensor::zeros({2}, DType::kF64), 1.0), Error);
  EXPECT_THROW(optim::LossScaler(8.0).step_factor(Tensor::scalar(1.0, DType::kF64), 1.0),
               Error);  // no to()
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
  // After to(), set_state (a resume) writes the device copy as well.
  b.to(Device::cpu());
  b.set_state({32.0, 2, 5});
  EXPECT_EQ(b.device_state().to_vector(), (std::vector<double>{32.0, 2.0, 5.0}));
  EXPECT_EQ(b.device_scale().item(), 32.0);
}

}  // namespace
}  // namespace loom
