// tests/layers/transformer_test.cpp — the whole model: gradient checks in f64 (gpt2, llama,
// gpt2 with dropout and activation checkpointing), parameter names and counts (against the
// published GPT-2 sizes), tied head, padded vocab, loss at init, a short SGD run, activation
// checkpointing (same gradients, less memory), FLOPs, validate() messages, and the parameter
// units with their forward hooks.
#include "layers/transformer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/allocator.h"
#include "core/ops/view.h"
#include "tests/gradcheck.h"
#include "tests/layers/tiny_models.h"

namespace loom {
namespace {

using testing::random_ids;
using testing::tiny_gpt2;
using testing::tiny_llama;

// Targets: the ids shifted by one, with one ignored position.
Tensor targets_for(const Tensor& ids, int64_t vocab) {
  std::vector<int32_t> t;
  for (double v : ids.to_vector())
    t.push_back(static_cast<int32_t>((static_cast<int64_t>(v) + 1) % vocab));
  t[1] = -100;
  return Tensor::from_vector(t, ids.shape());
}

void gradcheck_model(const ModelConfig& c, bool dropout_gen) {
  Transformer model(c, DType::kF64);
  Generator init_gen(42);
  model.init_weights(init_gen);
  testing::perturb_parameters(model, 0.1, 43);  // norms off 1, biases off 0, bigger weights
  const Tensor ids = random_ids(2, 5, c.vocab_size, 7);
  const Tensor targets = targets_for(ids, c.vocab_size);
  const std::vector<Tensor> params = model.parameters();
  // One key: every evaluation draws the same dropout masks (Note [Dropout by coordinates]).
  const DropoutKey key{5, 0, 0};
  auto loss_fn = [&](const std::vector<Tensor>&) {
    return model.loss(ids, targets, dropout_gen ? &key : nullptr);
  };
  auto logits_fn = [&](const std::vector<Tensor>&) {
    return model.forward(ids, dropout_gen ? &key : nullptr);
  };
  testing::expect_gradcheck(loss_fn, params, 1e-6, 1e-7, 1e-5, 20);
  testing::expect_gradcheck(logits_fn, params, 1e-6, 1e-6, 1e-5, 20);
}

TEST(Transformer, Gpt2Gradcheck) { gradcheck_model(tiny_gpt2(), false); }
TEST(Transformer, LlamaGradcheck) { gradcheck_model(tiny_llama(), false); }
TEST(Transformer, Gpt2DropoutCheckpointedGradcheck) {
  ModelConfig c = tiny_gpt2();
  c.dropout = 0.2;
  c.recompute = "full";
  gradcheck_model(c, true);
}

std::vector<std::string> names_of(const Module& m) {
  std::vector<std::string> out;
  for (auto& [n, t] : m.named_parameters()) out.push_back(n);
  return out;
}

// Note [Parameter roles] in layers/transformer.cpp: every parameter carries its part, block and
// name there; the test reads the same from the names (its own parse), for both architectures
// and an untied head.
TEST(Transformer, EveryParameterHasItsRole) {
  for (ModelConfig c : {tiny_gpt2(), tiny_llama()}) {
    for (bool tied : {true, false}) {
      c.tie_embeddings = tied;
      Transformer m(c);
      int blocks = 0;
      for (const auto& [name, p] : m.named_parameters()) {
        const ParamRole* r = p.role();
        ASSERT_NE(r, nullptr) << name;
        if (name.rfind("blocks.", 0) == 0) {
          const size_t dot = name.find('.', 7);
          EXPECT_EQ(r->part, ParamRole::Part::kBlock) << name;
          EXPECT_EQ(r->block, std::stoll(name.substr(7, dot - 7))) << name;
          EXPECT_EQ(r->name, name.substr(dot + 1)) << name;
          ++blocks;
        } else {
          const bool input = name.rfind("wte.", 0) == 0 || name.rfind("wpe.", 0) == 0;
          EXPECT_EQ(r->part, input ? ParamRole::Part::kInput : ParamRole::Part::kOutput) << name;
          EXPECT_EQ(r->block, -1) << name;
          EXPECT_EQ(r->name, name);
        }
      }
      EXPECT_GT(blocks, 0);
    }
  }
}

TEST(Transformer, Gpt2ParameterNamesAndShapes) {
  Transformer m(tiny_gpt2());
  std::vector<std::string> expected = {"wte.weight", "wpe.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.qkv.weight", "attn.qkv.bias",
                          "attn.proj.weight", "attn.proj.bias", "ln_2.weight", "ln_2.bias",
                          "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"}) {
      expected.push_back(b + s);
    }
  }
  expected.push_back("ln_f.weight");
  expected.push_back("ln_f.bias");
  EXPECT_EQ(names_of(m), expected);
  EXPECT_EQ(m.parameter("wte.weight").shape(), (Shape{12, 8}));
  EXPECT_EQ(m.parameter("wpe.weight").shape(), (Shape{8, 8}));
  EXPECT_EQ(m.parameter("blocks.1.attn.qkv.weight").shape(), (Shape{24, 8}));
  EXPECT_EQ(m.parameter("blocks.1.mlp.fc.weight").shape(), (Shape{32, 8}));
  EXPECT_EQ(m.parameter("blocks.1.mlp.proj.weight").shape(), (Shape{8, 32}));
  EXPECT_TRUE(m.head_weight().same(m.wte_weight()));
}

TEST(Transformer, LlamaParameterNamesAndShapes) {
  Transformer m(tiny_llama());
  std::vector<std::string> expected = {"wte.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    for (const char* s :
         {"attn_norm.weight", "attn.qkv.weight", "attn.proj.weight", "mlp_norm.weight",
          "mlp.gate.weight", "mlp.up.weight", "mlp.down.weight"}) {
      expected.push_back(b + s);
    }
  }
  expected.push_back("norm_f.weight");
  expected.push_back("lm_head.weight");
  EXPECT_EQ(names_of(m), expected);
  EXPECT_EQ(m.parameter("blocks.0.attn.qkv.weight").shape(), (Shape{(2 + 2 * 1) * 4, 8}));
  EXPECT_EQ(m.parameter("blocks.0.mlp.gate.weight").shape(), (Shape{24, 8}));
  EXPECT_EQ(m.parameter("blocks.0.mlp.down.weight").shape(), (Shape{8, 24}));
  EXPECT_EQ(m.parameter("lm_head.weight").shape(), (Shape{12, 8}));
  ModelConfig tied = tiny_llama();
  tied.tie_embeddings = true;
  Transformer t(tied);
  EXPECT_EQ(names_of(t).back(), "norm_f.weight");
}

TEST(Transformer, CountsMatchInstantiatedModels) {
  ModelConfig untied_gpt2 = tiny_gpt2();
  untied_gpt2.tie_embeddings = false;
  ModelConfig mha_llama = tiny_llama();
  mha_llama.n_kv_head = 0;
  for (const ModelConfig& c : {tiny_gpt2(), tiny_llama(), untied_gpt2, mha_llama}) {
    Transformer m(c);
    EXPECT_EQ(count_parameters(c), m.num_parameters()) << c.arch;
    EXPECT_EQ(count_parameters(c, true), m.num_parameters(true)) << c.arch;
    const int64_t pad = (c.padded_vocab() - c.vocab_size) * c.n_embd * (c.tie_embeddings ? 1 : 2);
    EXPECT_EQ(m.num_parameters() - m.num_parameters(true), pad);
  }
  // gpt2 tiny by hand: wte 12·8 + wpe 8·8 + 2·(12·64 + 13·8) + 2·8.
  EXPECT_EQ(Transformer(tiny_gpt2()).num_parameters(), 96 + 64 + 2 * (768 + 104) + 16);
}

ModelConfig gpt2_size(int64_t layers, int64_t heads, int64_t embd) {
  ModelConfig c;  // defaults: vocab 50257 padded to 50304, max_seq_len 1024, tied
  c.n_layer = layers;
  c.n_head = heads;
  c.n_embd = embd;
  return c;
}

TEST(Transformer, PublishedGpt2Sizes) {
  // The published counts use the unpadded vocabulary (exclude_padding = true).
  EXPECT_EQ(count_parameters(gpt2_size(12, 12, 768), true), 124'439'808);
  EXPECT_EQ(count_parameters(gpt2_size(24, 16, 1024), true), 354'823'168);
  EXPECT_EQ(count_parameters(gpt2_size(36, 20, 1280), true), 774'030'080);
  EXPECT_EQ(count_parameters(gpt2_size(48, 25, 1600), true), 1'557'611'200);
  // llm.c's padded 124M (Vp = 50304): 47 more rows of 768.
  EXPECT_EQ(count_parameters(gpt2_size(12, 12, 768)), 124'439'808 + 47 * 768);
}

TEST(Transformer, FlopsPerToken) {
  Transformer g(tiny_gpt2());
  const double n = static_cast<double>(g.num_parameters() - 8 * 8);  // less wpe
  EXPECT_DOUBLE_EQ(g.flops_per_token(5), 6 * n + 12.0 * 2 * 8 * 5);
  Transformer l(tiny_llama());
  const double nl = static_cast<double>(l.num_parameters() - 12 * 8);  // less the input table
  EXPECT_DOUBLE_EQ(l.flops_per_token(8), 6 * nl + 12.0 * 2 * 8 * 8);
}

TEST(Transformer, TiedHeadGetsGradientFromBothUses) {
  ModelConfig c = tiny_gpt2();
  Transformer tied(c, DType::kF64);
  c.tie_embeddings = false;
  Transformer untied(c, DType::kF64);
  Generator gen(3);
  tied.init_weights(gen);
  testing::perturb_parameters(tied, 0.1, 4);
  {
    autograd::NoGradGuard ng;
    for (auto& [name, p] : tied.named_parameters()) {
      Tensor dst = untied.parameter(name);
      ops::copy_(dst, p);
    }
    Tensor head = untied.parameter("lm_head.weight");
    ops::copy_(head, tied.wte_weight());
  }
  const Tensor ids = random_ids(2, 5, 11, 8);
  const Tensor targets = targets_for(ids, 11);
  const Tensor l1 = tied.loss(ids, targets), l2 = untied.loss(ids, targets);
  EXPECT_DOUBLE_EQ(l1.item(), l2.item());
  autograd::backward(l1);
  autograd::backward(l2);
  const std::vector<double> g = tied.wte_weight().grad().to_vector();
  const std::vector<double> ge = untied.parameter("wte.weight").grad().to_vector();
  const std::vector<double> gh = untied.parameter("lm_head.weight").grad().to_vector();
  double emb_norm = 0, head_norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_NEAR(g[i], ge[i] + gh[i], 1e-12) << i;
    emb_norm += ge[i] * ge[i];
    head_norm += gh[i] * gh[i];
  }
  EXPECT_GT(emb_norm, 1e-8);  // both uses contribute
  EXPECT_GT(head_norm, 1e-8);
}

TEST(Transformer, PaddedVocabDoesNotAffectLoss) {
  for (const ModelConfig& c : {tiny_gpt2(), tiny_llama()}) {
    Transformer m(c);
    Generator gen(1);
    m.init_weights(gen);
    const Tensor head = m.head_weight();
    for (int64_t r = c.vocab_size; r < c.padded_vocab(); ++r) {  // padded rows start zero
      for (int64_t k = 0; k < c.n_embd; ++k) EXPECT_EQ(head.at({r, k}), 0.0);
    }
    const Tensor ids = random_ids(2, 5, c.vocab_size, 2);
    const Tensor targets = targets_for(ids, c.vocab_size);
    const double before = m.loss(ids, targets).item();
    {
      autograd::NoGradGuard ng;
      Tensor pad = ops::narrow(head, 0, c.vocab_size, c.padded_vocab() - c.vocab_size);
      Generator noise(4);
      ops::copy_(pad, randn(pad.shape(), noise, DType::kF32, 0.0, 50.0));
    }
    const Tensor logits = m.forward(ids);
    EXPECT_GT(std::abs(logits.at({0, 0, c.padded_vocab() - 1})), 1.0);  // padded logits did change
    const Tensor loss = m.loss(ids, targets);
    EXPECT_DOUBLE_EQ(loss.item(), before) << c.arch;
    autograd::backward(loss);
    const Tensor g = head.grad();
    for (int64_t r = c.vocab_size; r < c.padded_vocab(); ++r) {
      for (int64_t k = 0; k < c.n_embd; ++k) EXPECT_EQ(g.at({r, k}), 0.0) << c.arch;
    }
  }
}

TEST(Transformer, LossAtInitIsNearLnVocab) {
  for (const ModelConfig& c : {tiny_gpt2(), tiny_llama()}) {
    Transformer m(c);
    Generator gen(9);
    m.init_weights(gen);
    const Tensor ids = random_ids(4, 8, c.vocab_size, 3);
    EXPECT_NEAR(m.loss(ids, targets_for(ids, c.vocab_size)).item(), std::log(11.0), 0.05) << c.arch;
  }
}

TEST(Transformer, InitFollowsTheRecipe) {
  ModelConfig c = tiny_gpt2();
  c.n_embd = 64;
  c.n_head = 4;
  c.init_std = 0.1;
  Transformer m(c);
  Generator gen(2);
  m.init_weights(gen);
  auto stddev = [](const Tensor& t) {
    double s = 0;
    for (double v : t.to_vector()) s += v * v;
    return std::sqrt(s / static_cast<double>(t.numel()));
  };
  EXPECT_NEAR(stddev(m.parameter("blocks.0.mlp.fc.weight")), 0.1, 0.01);
  EXPECT_NEAR(stddev(m.parameter("blocks.0.mlp.proj.weight")), 0.05, 0.005);  // 0.1/√(2·2)
  EXPECT_NEAR(stddev(m.parameter("blocks.1.attn.proj.weight")), 0.05, 0.005);
  EXPECT_EQ(stddev(m.parameter("blocks.0.attn.qkv.bias")), 0.0);
  for (double v : m.parameter("ln_f.weight").to_vector()) EXPECT_EQ(v, 1.0);
}

// Plain SGD on a fixed repeating sequence (token t is followed by t+1 mod V).
double train_sgd(const ModelConfig& c, int steps, double lr) {
  Transformer m(c);
  Generator gen(17);
  m.init_weights(gen);
  std::vector<int32_t> ids, targets;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 8; ++t) {
      ids.push_back(static_cast<int32_t>((3 * b + t) % c.vocab_size));
      targets.push_back(static_cast<int32_t>((3 * b + t + 1) % c.vocab_size));
    }
  }
  const Tensor x = Tensor::from_vector(ids, {2, 8}), y = Tensor::from_vector(targets, {2, 8});
  double loss = 0;
  for (int s = 0; s < steps; ++s) {
    m.zero_grad();
    const Tensor l = m.loss(x, y);
    loss = l.item();
    autograd::backward(l);
    for (Tensor p : m.parameters()) ops::add_(p, p.grad(), -lr);
  }
  return loss;
}

TEST(Transformer, SgdLearnsARepeatingSequence) {
  ModelConfig g = tiny_gpt2();
  g.n_embd = 32;
  g.n_head = 4;
  ModelConfig l = tiny_llama();
  l.n_embd = 32;
  l.n_head = 4;
  l.n_kv_head = 2;
  const double ln_v = std::log(11.0);
  EXPECT_LT(train_sgd(g, 40, 1.0), 0.5 * ln_v);
  EXPECT_LT(train_sgd(l, 40, 1.0), 0.5 * ln_v);
}

struct RunResult {
  double loss;
  int64_t activation_bytes;
  std::vector<std::vector<double>> grads;
};

RunResult run_once(ModelConfig c, bool checkpointing, DType dtype,
                   const std::string& selective_save = "") {
  c.recompute = checkpointing ? "full" : "none";
  if (!selective_save.empty()) {
    c.recompute = "selective";
    c.recompute_save = selective_save;
  }
  Transformer m(c, dtype);
  Generator gen(1);
  m.init_weights(gen);
  const Tensor ids = random_ids(4, 16, c.vocab_size, 5);
  const Tensor targets = targets_for(ids, c.vocab_size);
  const DropoutKey drop{77, 3, 1};
  RunResult r;
  const int64_t before = allocator_for(DeviceType::kCpu).stats().current_bytes;
  Tensor loss = m.loss(ids, targets, &drop);
  r.activation_bytes = allocator_for(DeviceType::kCpu).stats().current_bytes - before;
  r.loss = loss.item();
  autograd::backward(loss);
  for (const Tensor& p : m.parameters()) r.grads.push_back(p.grad().to_vector());
  return r;
}

TEST(Transformer, ActivationCheckpointingSameGradientsLessMemory) {
  ModelConfig c = tiny_gpt2();
  c.n_layer = 4;
  c.n_embd = 32;
  c.n_head = 4;
  c.max_seq_len = 16;
  c.dropout = 0.1;
  for (const ModelConfig& cfg : {c, [&] {
                                   ModelConfig l = c;
                                   l.arch = "llama";
                                   l.n_kv_head = 2;
                                   return l;
                                 }()}) {
    const RunResult plain = run_once(cfg, false, DType::kF64);
    const RunResult ckpt = run_once(cfg, true, DType::kF64);
    EXPECT_EQ(plain.loss, ckpt.loss) << cfg.arch;
    ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      EXPECT_LT(testing::rel_error(ckpt.grads[i], plain.grads[i]), 1e-13)
          << cfg.arch << " param " << i;
    }
    EXPECT_LT(ckpt.activation_bytes, plain.activation_bytes / 2) << cfg.arch;
  }
}

// Note [Selective recompute] in core/checkpoint.h: the gradients of no recompute, exactly, and
// between the forward and the backward each block holds, beyond what full recompute holds, the
// results of the kept ops — counted here from the model's shape (per block of N = B·T tokens:
// matmul, GPT-2: qkv 3C, proj C, the fused MLP's pre-activation F and output C; Llama: qkv
// q + 2kv, proj C, gate F, up F, down C; attention: its output q and lse, heads per token).
TEST(Transformer, SelectiveRecomputeSameGradientsHoldsTheKeptResults) {
  ModelConfig c = tiny_gpt2();
  c.n_layer = 3;
  c.n_embd = 32;
  c.n_head = 4;
  c.max_seq_len = 16;
  c.dropout = 0.1;
  ModelConfig l = c;
  l.arch = "llama";
  l.n_kv_head = 2;
  l.ffn_hidden = 48;
  const int64_t N = 4 * 16, e = 8;  // run_once: B 4, T 16, f64
  for (const ModelConfig& cfg : {c, l}) {
    const RunResult plain = run_once(cfg, false, DType::kF64);
    const RunResult full = run_once(cfg, true, DType::kF64);
    const int64_t C = cfg.n_embd, F = cfg.ffn_hidden_size(), q = cfg.n_head * cfg.head_dim(),
                  kv = cfg.kv_heads() * cfg.head_dim();
    const int64_t matmul = cfg.is_llama() ? N * (q + 2 * kv) + N * C + 2 * N * F + N * C
                                          : N * 3 * C + N * C + N * F + N * C;
    const int64_t attention = N * q + N * cfg.n_head;
    for (const std::string save : {"matmul,attention", "matmul", "attention"}) {
      SCOPED_TRACE(cfg.arch + " keeping " + save);
      const RunResult sel = run_once(cfg, false, DType::kF64, save);
      EXPECT_EQ(sel.loss, plain.loss);
      ASSERT_EQ(sel.grads.size(), plain.grads.size());
      for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_EQ(sel.grads[i], plain.grads[i]) << i;
      const int64_t kept = (save.find("matmul") != std::string::npos ? matmul : 0) +
                           (save.find("attention") != std::string::npos ? attention : 0);
      EXPECT_EQ(sel.activation_bytes, full.activation_bytes + cfg.n_layer * kept * e);
    }
  }
}

TEST(Transformer, ForwardChecksShapes) {
  Transformer m(tiny_gpt2());
  EXPECT_THROW(m.forward(random_ids(1, 9, 11, 1)), Error);  // T > max_seq_len
  EXPECT_THROW(m.forward(Tensor::zeros({5}, DType::kI32)), Error);
  const Tensor ids = random_ids(2, 5, 11, 1);
  EXPECT_EQ(m.forward(ids).shape(), (Shape{2, 5, 12}));
  // Explicit positions equal to arange(T) give the same logits.
  const Tensor pos = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4}, {5});
  EXPECT_EQ(m.forward(ids, pos, nullptr).to_vector(), m.forward(ids).to_vector());
}

void expect_invalid(const ModelConfig& c, const std::string& message) {
  try {
    validate(c);
    ADD_FAILURE() << "no error; expected: " << message;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
  EXPECT_THROW(Transformer{c}, ConfigError);
}

TEST(Transformer, ValidateNamesTheKey) {
  ModelConfig c = tiny_gpt2();
  EXPECT_NO_THROW(validate(c));
  EXPECT_NO_THROW(validate(tiny_llama()));
  c.n_embd = 100;
  c.n_head = 3;
  expect_invalid(c, "model.n_embd: 100 is not divisible by model.n_head 3");
  c = tiny_gpt2();
  c.n_head = 4;
  c.n_kv_head = 3;
  expect_invalid(c, "model.n_kv_head: 3 does not divide model.n_head 4");
  c = tiny_llama();
  c.n_embd = 6;
  expect_invalid(c, "model.n_embd: head dim n_embd/n_head = 3 must be even");
  c = tiny_gpt2();
  c.arch = "bert";
  expect_invalid(c, "model.arch: unknown architecture 'bert'");
  c = tiny_gpt2();
  c.n_layer = 0;
  expect_invalid(c, "model.n_layer: must be positive, got 0");
  c = tiny_gpt2();
  c.vocab_size = -1;
  expect_invalid(c, "model.vocab_size");
  c = tiny_gpt2();
  c.dropout = 1.0;
  expect_invalid(c, "model.dropout");
  c = tiny_gpt2();
  c.max_seq_len = 0;
  expect_invalid(c, "model.max_seq_len");
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// Records the unit hook calls as "+u" / "-u" and passes outputs through unchanged.
class CallLog final : public UnitHooks {
 public:
  void before_forward(int unit) override { calls += "+" + std::to_string(unit) + " "; }
  Tensor after_forward(int unit, const Tensor& out) override {
    calls += "-" + std::to_string(unit) + " ";
    return out;
  }
  std::string calls;
};

// Note [Parameter units]: every parameter in exactly one unit, in named_parameters() order,
// and the forward brackets each unit in order (the tied gpt2 head enters unit 0 again).
TEST(Transformer, ParameterUnitsAndHookOrder) {
  for (const ModelConfig& c : {tiny_gpt2(), tiny_llama()}) {
    Transformer m(c);
    Generator gen(4);
    m.init_weights(gen);
    const auto units = m.parameter_units();
    ASSERT_EQ(units.size(), static_cast<size_t>(c.n_layer + 2)) << c.arch;
    std::vector<std::string> flat;
    for (size_t u = 0; u < units.size(); ++u) {
      ASSERT_FALSE(units[u].empty()) << c.arch << " unit " << u;
      for (const auto& [name, p] : units[u]) {
        flat.push_back(name);
        if (u == 0) {
          EXPECT_TRUE(name.rfind("wte.", 0) == 0 || name.rfind("wpe.", 0) == 0) << name;
        }
        if (u >= 1 && u <= static_cast<size_t>(c.n_layer)) {
          EXPECT_EQ(name.rfind("blocks." + std::to_string(u - 1) + ".", 0), 0u) << name;
        }
        EXPECT_TRUE(p.same(m.parameter(name))) << name;
      }
    }
    std::vector<std::string> names;
    for (const auto& [name, p] : m.named_parameters()) names.push_back(name);
    EXPECT_EQ(flat, names) << c.arch;

    const Tensor ids = random_ids(2, 5, c.vocab_size, 1);
    const Tensor plain = m.forward(ids);
    CallLog log;
    m.set_unit_hooks(&log);
    const Tensor hooked = m.forward(ids);
    m.set_unit_hooks(nullptr);
    std::string expected = "+0 -0 ";
    for (int64_t i = 1; i <= c.n_layer; ++i)
      expected += "+" + std::to_string(i) + " -" + std::to_string(i) + " ";
    const std::string head = std::to_string(c.n_layer + 1);
    expected +=
        c.tie_embeddings ? "+" + head + " +0 -0 -" + head + " " : "+" + head + " -" + head + " ";
    EXPECT_EQ(log.calls, expected) << c.arch;
    EXPECT_EQ(hooked.to_vector(), plain.to_vector()) << c.arch;
  }
}

}  // namespace
}  // namespace loom
