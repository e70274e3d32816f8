// tests/layers/module_test.cpp — Module registries (names, order, train mode, counts), the
// basic layers (Linear, norms, MLPs) against explicit formulas, and CausalSelfAttention against
// a loop reference that reads q, k and v rows in llm.c's fused layout (Note [Fused qkv layout]).
#include "layers/module.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/ops/view.h"
#include "layers/attention.h"
#include "layers/block.h"
#include "layers/linear.h"
#include "layers/mlp.h"
#include "layers/norm.h"
#include "tests/gradcheck.h"
#include "tests/layers/tiny_models.h"

namespace loom {
namespace {

class Leaf : public Module {
 public:
  Leaf() {
    a = register_parameter("a", Tensor::zeros({2, 3}));
    b = register_parameter("b", Tensor::zeros({4}));
  }
  Tensor a, b;
};

class Parent : public Module {
 public:
  Parent() {
    w = register_parameter("w", Tensor::zeros({5}));
    register_module("first", first);
    register_module("second", second);
  }
  Tensor w;
  Leaf first, second;
};

class Root : public Module {
 public:
  Root() {
    register_module("blocks.0", p0);
    register_module("blocks.1", p1);
    register_parameter("head", Tensor::zeros({1}));
  }
  Parent p0, p1;
};

TEST(Module, NamesAreDepthFirstInRegistrationOrder) {
  Root r;
  std::vector<std::string> names;
  for (auto& [n, t] : r.named_parameters()) {
    names.push_back(n);
    EXPECT_TRUE(t.requires_grad()) << n;
    EXPECT_TRUE(t.is_leaf()) << n;
  }
  // Own parameters come before children's, whatever the registration interleaving.
  const std::vector<std::string> expected = {"head",
                                             "blocks.0.w",
                                             "blocks.0.first.a",
                                             "blocks.0.first.b",
                                             "blocks.0.second.a",
                                             "blocks.0.second.b",
                                             "blocks.1.w",
                                             "blocks.1.first.a",
                                             "blocks.1.first.b",
                                             "blocks.1.second.a",
                                             "blocks.1.second.b"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(r.num_parameters(), 1 + 2 * (5 + 2 * (6 + 4)));
  EXPECT_TRUE(r.parameter("blocks.1.second.b").same(r.p1.second.b));
  EXPECT_THROW(r.parameter("blocks.2.w"), Error);
}

TEST(Module, TrainModePropagates) {
  Root r;
  EXPECT_TRUE(r.training());
  r.train(false);
  EXPECT_FALSE(r.p1.second.training());
  EXPECT_FALSE(r.p0.training());
  r.train(true);
  EXPECT_TRUE(r.p1.first.training());
}

TEST(Module, RejectsDuplicatesAndNonLeaves) {
  Leaf l;
  EXPECT_THROW(l.register_parameter("a", Tensor::zeros({1})), Error);
  Tensor x = Tensor::zeros({2});
  x.set_requires_grad(true);
  Tensor y = ops::clone(x);
  EXPECT_THROW(l.register_parameter("y", y), Error);
  EXPECT_THROW(l.register_parameter("i", Tensor::zeros({2}, DType::kI32)), Error);
  Leaf other;
  l.register_module("child", other);
  EXPECT_THROW(l.register_module("child", other), Error);
}

TEST(Module, ZeroGradClearsEveryParameter) {
  Parent p;
  for (Tensor t : p.parameters()) t.set_grad(Tensor::ones(t.shape()));
  p.zero_grad();
  for (const Tensor& t : p.parameters()) EXPECT_FALSE(t.grad().defined());
}

TEST(Layers, LinearMatchesFormulaAndGradchecks) {
  Linear lin(3, 4, true, DType::kF64);
  Generator init_gen(1);
  lin.init(init_gen, 0.5);
  testing::perturb_parameters(lin, 0.3, 2);
  Generator gen(3);
  Tensor x = testing::random({2, 5, 3}, gen);
  Tensor y = lin.forward(x);
  ASSERT_EQ(y.shape(), (Shape{2, 5, 4}));
  for (int64_t o = 0; o < 4; ++o) {
    double ref = lin.bias().at({o});
    for (int64_t i = 0; i < 3; ++i) ref += x.at({1, 2, i}) * lin.weight().at({o, i});
    EXPECT_NEAR(y.at({1, 2, o}), ref, 1e-12);
  }
  std::vector<Tensor> inputs = {x, lin.weight(), lin.bias()};
  testing::expect_gradcheck([&](const std::vector<Tensor>& in) { return lin.forward(in[0]); },
                            inputs);
  Linear nobias(3, 4, false);
  EXPECT_FALSE(nobias.bias().defined());
  EXPECT_EQ(nobias.named_parameters().size(), 1u);
}

TEST(Layers, NormsAndMlpsGradcheck) {
  Generator gen(5);
  LayerNorm ln(6, 1e-5, true, DType::kF64);
  RMSNorm rms(6, 1e-5, DType::kF64);
  Mlp mlp(6, 10, true, DType::kF64);
  SwiGluMlp swi(6, 10, false, DType::kF64);
  mlp.init(gen, 0.4, 0.2);
  swi.init(gen, 0.4, 0.2);
  for (const Module* m : {static_cast<const Module*>(&ln), static_cast<const Module*>(&rms),
                          static_cast<const Module*>(&mlp), static_cast<const Module*>(&swi)}) {
    testing::perturb_parameters(*m, 0.2, 6);
  }
  Tensor x = testing::random({2, 3, 6}, gen);
  auto check = [&](const auto& layer) {
    std::vector<Tensor> inputs = {x};
    for (const Tensor& p : layer.parameters()) inputs.push_back(p);
    testing::expect_gradcheck([&](const std::vector<Tensor>& in) { return layer.forward(in[0]); },
                              inputs);
  };
  check(ln);
  check(rms);
  check(mlp);
  check(swi);
  // RMSNorm with unit weight: every row has mean square 1.
  RMSNorm unit(6, 0.0, DType::kF64);
  Tensor y = unit.forward(x.detach());
  double ms = 0;
  for (int64_t c = 0; c < 6; ++c) ms += y.at({0, 1, c}) * y.at({0, 1, c}) / 6.0;
  EXPECT_NEAR(ms, 1.0, 1e-9);
}

// Explicit attention reading the fused qkv weight rows as llm.c does: q rows [h·D, (h+1)·D),
// k rows Hq·D + g·D…, v rows (Hq + Hkv)·D + g·D…, query head h using kv head h / (Hq/Hkv).
std::vector<double> reference_attention(const CausalSelfAttention& attn, const Tensor& x,
                                        int64_t Hq, int64_t Hkv) {
  const Tensor& W = attn.qkv().weight();
  const Tensor& b = attn.qkv().bias();
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / Hq;
  auto row = [&](int64_t bb, int64_t t, int64_t r) {
    double s = b.at({r});
    for (int64_t c = 0; c < C; ++c) s += W.at({r, c}) * x.at({bb, t, c});
    return s;
  };
  std::vector<double> y(static_cast<size_t>(B * T * C), 0.0);
  for (int64_t bb = 0; bb < B; ++bb) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> p(static_cast<size_t>(i + 1));
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d)
            s += row(bb, i, h * D + d) * row(bb, j, Hq * D + g * D + d);
          p[j] = s / std::sqrt(static_cast<double>(D));
          m = std::max(m, p[j]);
        }
        for (double& v : p) l += (v = std::exp(v - m));
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += p[j] / l * row(bb, j, (Hq + Hkv) * D + g * D + d);
          y[static_cast<size_t>((bb * T + i) * C + h * D + d)] = o;
        }
      }
    }
  }
  return y;
}

TEST(Layers, AttentionUsesLlmcQkvLayout) {
  for (int64_t kv : {2, 1}) {  // multi-head, then grouped-query
    ModelConfig c = testing::tiny_gpt2();
    c.n_kv_head = kv;
    CausalSelfAttention attn(c, DType::kF64);
    Generator gen(11);
    attn.init(gen, 0.5, 0.5);
    testing::perturb_parameters(attn, 0.2, 12);
    Tensor x = testing::random({2, 5, 8}, gen, DType::kF64, false);
    Tensor pos = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3, 4}, {5});
    Tensor y = attn.forward(x, pos);
    // Feed the reference's concatenated heads through the output projection.
    Tensor heads = Tensor::from_vector(reference_attention(attn, x, 2, kv), {2, 5, 8});
    Tensor ref = attn.proj().forward(heads);
    EXPECT_LT(testing::rel_error(y, ref), 1e-12) << "kv heads " << kv;
    EXPECT_EQ(attn.qkv().weight().shape(), (Shape{(2 + 2 * kv) * 4, 8}));
  }
}

TEST(Layers, BlockDropoutNeedsAKeyOnlyWhenActive) {
  ModelConfig c = testing::tiny_gpt2();
  c.dropout = 0.5;
  Block block(c, DType::kF64);
  Generator gen(1);
  block.init(gen, 0.3, 0.3);
  Tensor x = testing::random({1, 4, 8}, gen, DType::kF64, false);
  Tensor pos = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3}, {4});
  EXPECT_THROW(block.forward(x, pos, nullptr), Error);
  const DropoutKey d1{9, 0, 0}, d2{9, 0, 0};
  EXPECT_EQ(block.forward(x, pos, &d1).to_vector(), block.forward(x, pos, &d2).to_vector());
  block.eval();
  const std::vector<double> eval_out = block.forward(x, pos, nullptr).to_vector();
  c.dropout = 0.0;
  Block plain(c, DType::kF64);
  Generator g2(1);
  plain.init(g2, 0.3, 0.3);
  EXPECT_EQ(plain.forward(x, pos).to_vector(), eval_out);
  block.train();
  EXPECT_NE(block.forward(x, pos, &d1).to_vector(), eval_out);
}

// Note [Dropout by coordinates]: the masks are a function of (seed, step, micro-batch, layer)
// and each element's global coordinates. Another step, micro-batch or layer draws other masks;
// a replica holding batch rows [2, 4) of 4 (Block::set_batch_slice) computes exactly those rows
// of the whole batch's output, as data parallelism needs.
TEST(Layers, BlockDropoutMasksFollowTheKeyAndTheCoordinates) {
  ModelConfig c = testing::tiny_gpt2();
  c.dropout = 0.5;
  Block layer0(c, DType::kF64, {}, {}, 0), layer1(c, DType::kF64, {}, {}, 1);
  Generator gen(1);
  layer0.init(gen, 0.3, 0.3);
  Generator same(1);
  layer1.init(same, 0.3, 0.3);  // the same weights
  Tensor x = testing::random({4, 4, 8}, gen, DType::kF64, false);
  Tensor pos = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3}, {4});
  const DropoutKey key{9, 3, 1};
  const std::vector<double> whole = layer0.forward(x, pos, &key).to_vector();
  for (const DropoutKey other : {DropoutKey{9, 4, 1}, DropoutKey{9, 3, 0}, DropoutKey{8, 3, 1}})
    EXPECT_NE(layer0.forward(x, pos, &other).to_vector(), whole);
  EXPECT_NE(layer1.forward(x, pos, &key).to_vector(), whole);
  layer0.set_batch_slice({2, 4});
  const std::vector<double> part =
      layer0.forward(x.narrow(0, 2, 2).contiguous(), pos, &key).to_vector();
  const std::vector<double> want(whole.begin() + 2 * 4 * 8, whole.end());
  EXPECT_EQ(part, want);
}

// One device's layout holds every token in order: the step runners feed the batch as it is and
// the model numbers the positions itself.
TEST(Layers, SingleDeviceLayoutHoldsTheWholeSequence) {
  const LayerContext one;
  Generator gen(3);
  const Tensor ids = randint({2, 6}, 0, 50, gen, DType::kI64);
  const Tensor local = one.layout->local_sequence(ids, 1);
  EXPECT_TRUE(local.same(ids));
  EXPECT_FALSE(one.layout->local_positions(6).defined());
  EXPECT_EQ(one.layout->sequence_length(6), 6);
}

}  // namespace
}  // namespace loom
