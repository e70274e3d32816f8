// tests/core/split_backward_test.cpp — backward_split and DeferredBackward (Note [Split
// backward] in core/autograd.h): B then W gives backward()'s gradients bit for bit (through
// matmul, linear, linear_gelu and gelu_mlp, whose weight gradients W computes, through a norm and
// an elementwise op that run whole, and through a parameter used twice); after B only the input
// has its gradient, and the parameters' ready hooks fire in W (also behind a checkpointed region,
// which computes every gradient in B); a stage with no input runs nothing in B; a whole Llama
// chunk (biases, q/k norms) splits the same way.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/autograd.h"
#include "core/checkpoint.h"
#include "core/ops/activation.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/norm.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "tests/layers/tiny_models.h"

namespace loom {
namespace {

struct Net {
  Tensor w1, b1, w2, b2, w3, b3, w4, g;  // parameters (leaves)
  std::vector<Tensor*> params() { return {&w1, &b1, &w2, &b2, &w3, &b3, &w4, &g}; }
};

Net make_net(uint64_t seed) {
  Generator gen(seed);
  Net n;
  const auto leaf = [&](Shape s) {
    Tensor t = randn(s, gen, DType::kF64, 0.0, 0.3);
    t.set_requires_grad(true);
    return t;
  };
  n.w1 = leaf({6, 4});
  n.b1 = leaf({6});
  n.w2 = leaf({8, 6});
  n.b2 = leaf({8});
  n.w3 = leaf({6, 8});
  n.b3 = leaf({6});
  n.w4 = leaf({4, 6});
  n.g = leaf({4});
  return n;
}

// x (3, 5, 4) through linear_gelu, gelu_mlp, a norm, a matmul with w4 (no bias), a product, and
// w1 used a second time.
Tensor forward(Net& n, const Tensor& x) {
  Tensor h = ops::linear_gelu(x, n.w1, n.b1);                   // (3, 5, 6)
  h = ops::gelu_mlp(h, n.w2, n.b2, n.w3, n.b3);                 // (3, 5, 6)
  h = ops::linear(h, n.w4, Tensor());                           // (3, 5, 4)
  h = ops::rms_norm(h, n.g, 1e-5);                              // (3, 5, 4)
  h = ops::mul(h, ops::linear(x, n.w1, n.b1).narrow(2, 0, 4));  // w1 again
  return h;
}

TEST(SplitBackward, BThenWEqualsBackwardBitForBit) {
  Generator gen(7);
  const Tensor dy = randn({3, 5, 4}, gen, DType::kF64);
  const Tensor x0 = randn({3, 5, 4}, gen, DType::kF64);

  Net a = make_net(11);
  Tensor xa = x0.clone();
  xa.set_requires_grad(true);
  autograd::backward({forward(a, xa)}, {dy});

  Net b = make_net(11);
  Tensor xb = x0.clone();
  xb.set_requires_grad(true);
  int fired = 0;
  for (Tensor* p : b.params()) p->register_grad_ready_hook([&fired](Tensor&) { ++fired; });
  autograd::DeferredBackward w = autograd::backward_split({forward(b, xb)}, {dy}, {xb});
  ASSERT_TRUE(xb.grad().defined()) << "B must compute the input's gradient";
  EXPECT_EQ(xb.grad().to_vector(), xa.grad().to_vector());
  for (Tensor* p : b.params()) EXPECT_FALSE(p->grad().defined()) << "a parameter's gradient in B";
  EXPECT_EQ(fired, 0);
  w.run();
  EXPECT_EQ(fired, 8);
  const std::vector<Tensor*> pa = a.params(), pb = b.params();
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pb[i]->grad().defined()) << "parameter " << i;
    EXPECT_EQ(pb[i]->grad().to_vector(), pa[i]->grad().to_vector()) << "parameter " << i;
  }
}

TEST(SplitBackward, NoInputRunsEverythingInW) {
  Generator gen(8);
  const Tensor x = randn({3, 5, 4}, gen, DType::kF64), dy = randn({3, 5, 4}, gen, DType::kF64);
  Net a = make_net(12), b = make_net(12);
  autograd::backward({forward(a, x)}, {dy});
  autograd::DeferredBackward w = autograd::backward_split({forward(b, x)}, {dy}, {});
  for (Tensor* p : b.params()) EXPECT_FALSE(p->grad().defined());
  w.run();
  const std::vector<Tensor*> pa = a.params(), pb = b.params();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(pb[i]->grad().to_vector(), pa[i]->grad().to_vector()) << "parameter " << i;
}

// A checkpointed region is a partial node: in B it recomputes its forward and computes its
// input's gradient only; its parameters' gradients (and accumulators, and hooks) wait for W.
TEST(SplitBackward, CheckpointedRegionDefersItsParametersAccumulation) {
  Generator gen(10);
  const Tensor x0 = randn({3, 5, 4}, gen, DType::kF64), dy = randn({3, 5, 4}, gen, DType::kF64);
  std::vector<std::vector<double>> want;
  for (int split = 0; split < 2; ++split) {
    Net n = make_net(13);
    Tensor x = x0.clone();
    x.set_requires_grad(true);
    int fired = 0;
    for (Tensor* p : n.params()) p->register_grad_ready_hook([&fired](Tensor&) { ++fired; });
    const Tensor y = checkpoint(
        [&n](const std::vector<Tensor>& in) { return std::vector<Tensor>{forward(n, in[0])}; },
        {x})[0];
    if (split == 0) {
      autograd::backward({y}, {dy});
    } else {
      autograd::DeferredBackward w = autograd::backward_split({y}, {dy}, {x});
      EXPECT_TRUE(x.grad().defined());
      for (Tensor* p : n.params()) EXPECT_FALSE(p->grad().defined());
      EXPECT_EQ(fired, 0);
      w.run();
    }
    EXPECT_EQ(fired, 8);
    std::vector<std::vector<double>> got = {x.grad().to_vector()};
    for (Tensor* p : n.params()) got.push_back(p->grad().to_vector());
    if (split == 0) {
      want = got;
    } else {
      EXPECT_EQ(got, want);
    }
  }
}

// The weight products of a checkpointed region run in W: a partial op inside counts its calls.
TEST(SplitBackward, CheckpointedRegionComputesItsWeightGradientsInW) {
  Generator gen(11);
  Tensor w = randn({4}, gen, DType::kF64);
  w.set_requires_grad(true);
  Tensor x = randn({3, 4}, gen, DType::kF64);
  x.set_requires_grad(true);
  int dx_calls = 0, dw_calls = 0;
  auto scale_by_w = [&](const Tensor& in) {  // in · w, recorded with a partial backward
    Tensor out = ops::mul(in.detach(), w.detach());
    const Tensor sin = in.detach(), sw = w.detach();
    autograd::record_partial_function(
        "scale_by_w", {in, w}, {&out},
        [&dx_calls, &dw_calls, sin, sw](const std::vector<Tensor>& g,
                                        const std::vector<bool>& want) {
          Tensor dx, dw;
          if (want[0]) {
            ++dx_calls;
            dx = ops::mul(g[0], sw);
          }
          if (want[1]) {
            ++dw_calls;
            dw = ops::sum(ops::mul(g[0], sin), 0);
          }
          return std::vector<Tensor>{dx, dw};
        });
    return out;
  };
  const Tensor y = checkpoint(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{scale_by_w(ops::gelu(in[0]))};
      },
      {x})[0];
  const Tensor dy = randn({3, 4}, gen, DType::kF64);
  autograd::DeferredBackward wpass = autograd::backward_split({y}, {dy}, {x});
  EXPECT_EQ(dx_calls, 1);
  EXPECT_EQ(dw_calls, 0);
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  wpass.run();
  EXPECT_EQ(dx_calls, 1);
  EXPECT_EQ(dw_calls, 1);
  const std::vector<double> gx = x.grad().to_vector(), gw = w.grad().to_vector();
  x.zero_grad();
  w.zero_grad();
  autograd::backward({scale_by_w(ops::gelu(x))}, {dy});
  EXPECT_EQ(gx, x.grad().to_vector());
  EXPECT_EQ(gw, w.grad().to_vector());
}

// Blocks 0 and 1 of a Llama with every bias and q/k norms, as a pipeline chunk runs them.
TEST(SplitBackward, TransformerChunkSplitsExactly) {
  ModelConfig c = testing::tiny_llama();
  c.attention_bias = true;
  c.mlp_bias = true;
  c.qk_norm = true;
  Generator gen(9);
  const Tensor x0 = randn({2, 6, 8}, gen, DType::kF64), dy = randn({2, 6, 8}, gen, DType::kF64);
  std::vector<std::vector<double>> want;
  for (int split = 0; split < 2; ++split) {
    Transformer m(c, DType::kF64);
    Generator init(5);
    m.init_weights(init);
    Tensor x = x0.clone();
    x.set_requires_grad(true);
    const Tensor y = m.run_blocks(x, Transformer::host_positions(6), 0, 2, nullptr);
    std::vector<std::vector<double>> got;
    if (split == 0) {
      autograd::backward({y}, {dy});
    } else {
      autograd::DeferredBackward w = autograd::backward_split({y}, {dy}, {x});
      for (const Tensor& p : m.parameters()) EXPECT_FALSE(p.grad().defined());
      w.run();
    }
    got.push_back(x.grad().to_vector());
    for (const Tensor& p : m.parameters())  // the tables and the head take no part: none
      got.push_back(p.grad().defined() ? p.grad().to_vector() : std::vector<double>{});
    if (split == 0) {
      size_t with_grad = 0;
      for (size_t i = 1; i < got.size(); ++i) with_grad += got[i].empty() ? 0 : 1;
      ASSERT_GE(with_grad, 2u * 9u) << "every block parameter has a gradient";
      want = got;
    } else {
      EXPECT_EQ(got, want);
    }
  }
}

}  // namespace
}  // namespace loom
