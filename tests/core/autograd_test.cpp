// tests/core/autograd_test.cpp — the tape: shared sub-expressions, accumulation into .grad,
// gradient-ready hooks (once per parameter, with the final gradient), partial hooks (offered a
// leaf's early contributions: Note [Partial gradients]), backward with explicit
// output gradients, no-grad mode, and activation checkpointing (same gradients, fewer bytes).
#include "core/autograd.h"

#include <gtest/gtest.h>

#include "core/checkpoint.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::random;
using testing::rel_error;

TEST(Autograd, SharedSubExpressionAccumulates) {
  // y = (x·x + x) · x: dy/dx = 3x² + 2x, reached through three paths.
  Generator gen(1);
  Tensor x = random({17}, gen);
  Tensor s = ops::add(ops::mul(x, x), x);
  Tensor y = ops::sum(ops::mul(s, x));
  autograd::backward(y);
  const auto xv = x.to_vector(), g = x.grad().to_vector();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(g[i], 3 * xv[i] * xv[i] + 2 * xv[i], 1e-12);
}

TEST(Autograd, GradAccumulatesAcrossBackwards) {
  Generator gen(2);
  Tensor x = random({3, 5}, gen);
  autograd::backward(ops::sum(ops::scale(x, 2.0)));
  autograd::backward(ops::sum(ops::scale(x, 3.0)));
  for (double v : x.grad().to_vector()) EXPECT_DOUBLE_EQ(v, 5.0);
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, HooksFireOncePerParameterWithTheFinalGradient) {
  Generator gen(3);
  Tensor w = random({4, 4}, gen), b = random({4}, gen), x = random({5, 4}, gen, DType::kF64, false);
  std::vector<std::string> fired;
  std::vector<double> w_grad_at_hook;
  w.register_grad_ready_hook([&](Tensor& p) {
    fired.push_back("w");
    w_grad_at_hook = p.grad().to_vector();
  });
  b.register_grad_ready_hook([&](Tensor&) { fired.push_back("b"); });
  // w is used three times, b twice: the hooks must still fire once each.
  Tensor h = ops::add(ops::matmul(x, w, false, true), b);
  Tensor h2 = ops::add(ops::matmul(h, w), b);
  Tensor loss = ops::sum(ops::mul(ops::matmul(h2, w, false, true), h2));
  autograd::backward(loss);
  ASSERT_EQ(fired.size(), 2u);
  EXPECT_EQ(std::count(fired.begin(), fired.end(), "w"), 1);
  EXPECT_EQ(std::count(fired.begin(), fired.end(), "b"), 1);
  EXPECT_EQ(w_grad_at_hook, w.grad().to_vector());  // nothing was added after the hook
}

// w used three times: y = sum((h2·wᵀ) ⊙ h2), h2 = (x·wᵀ + b)·w + b.
Tensor three_uses(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor h = ops::add(ops::matmul(x, w, false, true), b);
  Tensor h2 = ops::add(ops::matmul(h, w), b);
  return ops::sum(ops::mul(ops::matmul(h2, w, false, true), h2));
}

TEST(Autograd, PartialHooksAreOfferedEveryContributionButTheLast) {
  Generator gen(13);
  Tensor w = random({4, 4}, gen), b = random({4}, gen), x = random({5, 4}, gen, DType::kF64, false);
  autograd::backward(three_uses(x, w, b));
  const std::vector<double> want = w.grad().to_vector();
  w.zero_grad();
  b.zero_grad();
  // Taken: the hook sums what it took; .grad holds the rest; together they are the gradient,
  // and the ready hook still fires once, after the offers.
  Tensor taken = Tensor::zeros({4, 4}, DType::kF64);
  int offers = 0, ready = 0;
  w.register_grad_partial_hook([&](Tensor& leaf, const Tensor& g) {
    EXPECT_TRUE(leaf.same(w));
    EXPECT_EQ(ready, 0);
    ++offers;
    taken = ops::add(taken, g);
    return true;
  });
  w.register_grad_ready_hook([&](Tensor&) { ++ready; });
  autograd::backward(three_uses(x, w, b));
  EXPECT_EQ(offers, 2);  // three uses: two early contributions, the last one to .grad
  EXPECT_EQ(ready, 1);
  std::vector<double> got = ops::add(taken, w.grad()).to_vector();
  EXPECT_LT(rel_error(got, want), 1e-14);
  EXPECT_GT(rel_error(w.grad().to_vector(), want), 1e-3);  // .grad alone lacks what was taken

  // Declined: the engine sums every contribution as without hooks, bit for bit.
  Tensor v = random({4, 4}, gen);
  ops::copy_(v, w.detach());
  v.register_grad_partial_hook([&](Tensor&, const Tensor&) { return false; });
  autograd::backward(three_uses(x, v, b));
  EXPECT_EQ(v.grad().to_vector(), want);
}

TEST(Autograd, BackwardWithExplicitOutputGradients) {
  // A pipeline stage: y1 = 2x, y2 = x², seeded with g1, g2 → dx = 2·g1 + 2x·g2.
  Generator gen(4);
  Tensor x = random({3, 17}, gen);
  Tensor y1 = ops::scale(x, 2.0), y2 = ops::mul(x, x);
  Tensor g1 = random({3, 17}, gen, DType::kF64, false),
         g2 = random({3, 17}, gen, DType::kF64, false);
  autograd::backward({y1, y2}, {g1, g2});
  const auto xv = x.to_vector(), a = g1.to_vector(), b = g2.to_vector(), g = x.grad().to_vector();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(g[i], 2 * a[i] + 2 * xv[i] * b[i], 1e-12);
  EXPECT_THROW(autograd::backward({y1}, {Tensor::ones({2}, DType::kF64)}), Error);
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Generator gen(5);
  Tensor x = random({3}, gen);
  {
    autograd::NoGradGuard ng;
    Tensor y = ops::mul(x, x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
  }
  Tensor z = ops::mul(x, x);
  EXPECT_TRUE(z.requires_grad());
  EXPECT_NE(z.grad_fn(), nullptr);
  EXPECT_THROW(autograd::backward(ops::sum(x.detach())), Error);  // nothing requires grad
}

TEST(Autograd, GraphIsFreedAfterBackward) {
  Generator gen(6);
  Tensor x = random({64, 64}, gen);
  Tensor loss = ops::sum(ops::matmul(x, x));
  autograd::backward(loss);
  EXPECT_THROW(autograd::backward(loss), Error);  // saved tensors were released
}

// A small MLP-like region: two matmuls with a parameter captured by the closure.
std::vector<Tensor> region(const Tensor& w, const std::vector<Tensor>& in) {
  Tensor h = ops::mul(ops::matmul(in[0], w), in[0]);
  Tensor h2 = ops::mul(ops::matmul(h, w, false, true), h);
  return {ops::add(h2, in[1])};
}

TEST(Checkpoint, SameGradientsFewerBytes) {
  Generator gen(7);
  const int64_t n = 96;
  Tensor w = random({n, n}, gen, DType::kF64, true, 0.1);
  Tensor x0 = random({n, n}, gen), r = random({n, n}, gen);
  Allocator& alloc = allocator_for(DeviceType::kCpu);

  auto run = [&](bool ckpt, std::vector<double>& gw, std::vector<double>& gx,
                 std::vector<double>& gr, int64_t& held) {
    w.zero_grad();
    x0.zero_grad();
    r.zero_grad();
    int hooks = 0;
    const int64_t base = alloc.stats().current_bytes;
    Tensor x = ops::scale(x0, 1.5);  // an input with history
    auto fn = [&](const std::vector<Tensor>& in) { return region(w, in); };
    Tensor y = ckpt ? checkpoint(fn, {x, r})[0] : fn({x, r})[0];
    Tensor loss = ops::sum(ops::mul(y, y));
    held = alloc.stats().current_bytes - base;
    autograd::backward(loss);
    (void)hooks;
    gw = w.grad().to_vector();
    gx = x0.grad().to_vector();
    gr = r.grad().to_vector();
  };
  std::vector<double> gw1, gx1, gr1, gw2, gx2, gr2;
  int64_t held_plain = 0, held_ckpt = 0;
  run(false, gw1, gx1, gr1, held_plain);
  run(true, gw2, gx2, gr2, held_ckpt);
  EXPECT_LT(rel_error(gw2, gw1), 1e-14);
  EXPECT_LT(rel_error(gx2, gx1), 1e-14);
  EXPECT_LT(rel_error(gr2, gr1), 1e-14);
  // Plain: x, the two matmul outputs, h, h2, y are alive; checkpointed: x and y only.
  EXPECT_LT(held_ckpt, held_plain);
  const int64_t mat = n * n * 8;
  EXPECT_LE(held_ckpt, 3 * mat) << "checkpointed region should hold about x and y";
  EXPECT_GE(held_plain, 5 * mat);
}

TEST(Checkpoint, HooksFireOnceAndRandomnessIsReplayed) {
  Generator gen(8);
  Tensor w = random({8, 8}, gen);
  Tensor x = random({5, 8}, gen, DType::kF64, false);
  int fired = 0;
  w.register_grad_ready_hook([&](Tensor&) { ++fired; });
  Generator noise(99);
  // The region draws random numbers: recomputation must replay exactly the same ones.
  auto fn = [&](const std::vector<Tensor>& in) {
    Tensor m = randn({5, 8}, noise, DType::kF64);
    return std::vector<Tensor>{ops::mul(ops::matmul(in[0], w), m)};
  };
  const GeneratorState start = noise.state();
  Tensor y = checkpoint(fn, {x}, {&noise})[0];
  Tensor loss = ops::sum(ops::matmul(y, w));  // w is also used outside the region
  const GeneratorState after = noise.state();
  autograd::backward(loss);
  EXPECT_EQ(fired, 1);
  EXPECT_EQ(noise.state().offset, after.offset);  // the generator is left where forward left it
  std::vector<double> g_ckpt = w.grad().to_vector();
  w.zero_grad();
  noise.set_state(start);
  Tensor y2 = fn({x})[0];
  autograd::backward(ops::sum(ops::matmul(y2, w)));
  EXPECT_LT(rel_error(g_ckpt, w.grad().to_vector()), 1e-14);
}

TEST(Checkpoint, RejectsTensorsWithHistoryNotPassedAsInputs) {
  Generator gen(9);
  Tensor w = random({4, 4}, gen);
  Tensor hidden = ops::scale(w, 2.0);  // has history
  auto fn = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ops::mul(in[0], hidden)};
  };
  EXPECT_THROW(checkpoint(fn, {random({4, 4}, gen)}), Error);
}

}  // namespace
}  // namespace loom
