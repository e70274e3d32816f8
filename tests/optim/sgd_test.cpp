// tests/optim/sgd_test.cpp — SGD with momentum (plain and Nesterov) and weight decay against a
// double reference loop; gradients are never modified; momentum state naming.
#include "optim/sgd.h"

#include <gtest/gtest.h>

#include "core/rng.h"

namespace loom {
namespace {

struct RefSgd {  // torch.optim.SGD with dampening 0, one parameter, in double
  std::vector<double> p, buf;
  void step(const std::vector<double>& g, double lr, double mu, double wd, bool nesterov) {
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + wd * p[i];
      buf[i] = mu * buf[i] + d;
      d = nesterov ? d + mu * buf[i] : buf[i];
      p[i] -= lr * d;
    }
  }
};

void run_sgd(bool nesterov) {
  Generator gen(3);
  Tensor w = randn({4, 6}, gen, DType::kF64), b = randn({6}, gen, DType::kF64);
  const double mu = 0.9, wd = 0.05;
  optim::SGD opt({{"w", w, true}, {"b", b, false}}, mu, wd, nesterov);
  RefSgd rw{w.to_vector(), std::vector<double>(24)}, rb{b.to_vector(), std::vector<double>(6)};
  for (int t = 0; t < 4; ++t) {
    const double lr = 0.1 / (t + 1);
    w.set_grad(randn(w.shape(), gen, DType::kF64));
    b.set_grad(randn(b.shape(), gen, DType::kF64));
    const std::vector<double> gw = w.grad().to_vector(), gb = b.grad().to_vector();
    rw.step(gw, lr, mu, wd, nesterov);
    rb.step(gb, lr, mu, 0.0, nesterov);
    opt.step(lr);
    EXPECT_EQ(w.grad().to_vector(), gw);  // the gradient is left untouched
    EXPECT_EQ(b.grad().to_vector(), gb);
    const auto pw = w.to_vector(), pb = b.to_vector();
    for (size_t i = 0; i < pw.size(); ++i) EXPECT_NEAR(pw[i], rw.p[i], 1e-12);
    for (size_t i = 0; i < pb.size(); ++i) EXPECT_NEAR(pb[i], rb.p[i], 1e-12);
  }
}

TEST(Sgd, MomentumMatchesReference) { run_sgd(false); }
TEST(Sgd, NesterovMatchesReference) { run_sgd(true); }

TEST(Sgd, PlainSgdHasNoState) {
  Tensor w = Tensor::ones({3}, DType::kF64);
  optim::SGD opt({{"w", w, true}}, 0.0, 0.0);
  EXPECT_TRUE(opt.state_tensors().empty());
  w.set_grad(Tensor::full({3}, 2.0, DType::kF64));
  opt.step(0.25);
  for (double x : w.to_vector()) EXPECT_DOUBLE_EQ(x, 0.5);
  optim::SGD m({{"w", w, true}}, 0.9, 0.0);
  ASSERT_EQ(m.state_tensors().size(), 1u);
  EXPECT_EQ(m.state_tensors()[0].first, "momentum_buffer.w");
  EXPECT_THROW(optim::SGD({{"w", w, true}}, 0.0, 0.0, true), Error);
}

}  // namespace
}  // namespace loom
