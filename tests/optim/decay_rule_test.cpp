// tests/optim/decay_rule_test.cpp — the default weight-decay rule on GPT-2, Llama (Hugging Face)
// and Loom's own parameter names; the "all" and "matrices" variants; parsing.
#include "optim/decay_rule.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

using optim::DecayRule;

struct Case {
  const char* name;
  Shape shape;
  bool default_decay;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> kCases = {
      // GPT-2 (Hugging Face / llm.c naming)
      {"wte.weight", {50257, 768}, false},
      {"wpe.weight", {1024, 768}, false},
      {"h.0.ln_1.weight", {768}, false},
      {"h.0.ln_1.bias", {768}, false},
      {"h.0.attn.c_attn.weight", {768, 2304}, true},
      {"h.0.attn.c_attn.bias", {2304}, false},
      {"h.0.attn.c_proj.weight", {768, 768}, true},
      {"h.11.mlp.c_fc.weight", {768, 3072}, true},
      {"ln_f.weight", {768}, false},
      {"lm_head.weight", {50257, 768}, true},
      // Llama (Hugging Face naming)
      {"model.embed_tokens.weight", {32000, 4096}, false},
      {"model.layers.0.self_attn.q_proj.weight", {4096, 4096}, true},
      {"model.layers.0.mlp.gate_proj.weight", {11008, 4096}, true},
      {"model.layers.0.input_layernorm.weight", {4096}, false},
      {"model.layers.0.post_attention_layernorm.weight", {4096}, false},
      {"model.norm.weight", {4096}, false},
      // Loom's own modules
      {"blocks.0.attn_norm.weight", {64}, false},
      {"blocks.0.attn.qkv.weight", {192, 64}, true},
      {"blocks.0.mlp.fc.bias", {256}, false},
      {"norm_f.weight", {64}, false},
      {"encoder.LayerNorm.weight", {64, 64}, false},  // case-insensitive
  };
  return kCases;
}

TEST(DecayRule, DefaultRule) {
  for (const Case& c : cases()) {
    EXPECT_EQ(optim::decays(DecayRule::kDefault, c.name, c.shape), c.default_decay) << c.name;
  }
}

TEST(DecayRule, Variants) {
  for (const Case& c : cases()) {
    EXPECT_TRUE(optim::decays(DecayRule::kAll, c.name, c.shape)) << c.name;
    EXPECT_EQ(optim::decays(DecayRule::kMatricesOnly, c.name, c.shape), c.shape.size() >= 2)
        << c.name;
  }
  EXPECT_TRUE(optim::decays(DecayRule::kMatricesOnly, "wte.weight", {10, 4}));
}

TEST(DecayRule, ParseAndNames) {
  EXPECT_EQ(optim::parse_decay_rule("default"), DecayRule::kDefault);
  EXPECT_EQ(optim::parse_decay_rule("all"), DecayRule::kAll);
  EXPECT_EQ(optim::parse_decay_rule("matrices"), DecayRule::kMatricesOnly);
  for (DecayRule r : {DecayRule::kDefault, DecayRule::kAll, DecayRule::kMatricesOnly}) {
    EXPECT_EQ(optim::parse_decay_rule(optim::decay_rule_name(r)), r);
  }
  try {
    optim::parse_decay_rule("none");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string want = "optim.decay_rule: unknown rule 'none' (default, all, matrices)";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(DecayRule, MakeParamRefs) {
  const std::vector<std::pair<std::string, Tensor>> named = {
      {"wte.weight", Tensor::zeros({10, 4})},
      {"blocks.0.mlp.fc.weight", Tensor::zeros({16, 4})},
      {"blocks.0.mlp.fc.bias", Tensor::zeros({16})}};
  const auto refs = optim::make_param_refs(named);
  ASSERT_EQ(refs.size(), 3u);
  EXPECT_EQ(refs[1].name, "blocks.0.mlp.fc.weight");
  EXPECT_TRUE(refs[1].param.same(named[1].second));
  EXPECT_FALSE(refs[0].decay);
  EXPECT_TRUE(refs[1].decay);
  EXPECT_FALSE(refs[2].decay);
}

}  // namespace
}  // namespace loom
