// tests/parallel/sdp/block_level_test.cpp — SDP at the block level (parallel/sdp/block_level.h,
// Note [Block selection] in layers/build_context.h) in one process, f64 tiny GPT-2 and Llama
// models over several block covers, every worker: the forward-masking model (held blocks only,
// branches scaled by N/k) against an independent construction — the full model's embeddings,
// then its held blocks alone through Block::forward with their output projections' weights and
// biases multiplied by N/k, then its head — in logits, loss and gradients (with and without
// dropout); the held blocks' and the head's init equal to the full model's from the same
// generator; s = 1 with every block the default model bit for bit; backward masking's model equal
// to the full model with the frozen blocks getting no gradient and the others the full model's;
// a gradcheck through a scaled selected model; the block slices' ids and holders; the selection's
// errors and the parameter units.
#include "parallel/sdp/block_level.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "layers/transformer.h"
#include "layers/unit_hooks.h"
#include "tests/gradcheck.h"
#include "tests/layers/tiny_models.h"
#include "tests/parallel/sdp/sdp_test_util.h"

namespace loom::parallel::sdp {
namespace {

using loom::testing::rel_error;
using namespace test_util;  // NOLINT(build/namespaces): the shared test helpers

struct Case {
  int workers;
  int k;
  int64_t n_layer;
  uint64_t seed;
};

// Connected covers (k ≥ 2, C·n_layer ≥ 2): C from 1/4 to 3/4, 2 or 3 blocks held.
const std::vector<Case> kCases = {
    {4, 2, 4, 1}, {3, 2, 3, 7}, {4, 3, 4, 9}, {8, 2, 8, 11}, {6, 3, 4, 5}};

ModelConfig config(bool llama, int64_t n_layer, double dropout = 0.0) {
  ModelConfig c = test_util::config(llama);
  c.n_layer = n_layer;
  c.dropout = dropout;
  return c;
}

BlockAssignment cover_of(const Case& cs) {
  CoverOptions o;
  o.workers = cs.workers;
  o.coverage = static_cast<double>(cs.k) / cs.workers;
  o.seed = cs.seed;
  return assign_blocks(o, cs.n_layer);
}

// The test's own parse: block l of "blocks.<l>.…", or -1.
int64_t block_in_name(const std::string& name) {
  if (name.rfind("blocks.", 0) != 0) return -1;
  return std::stoll(name.substr(7, name.find('.', 7) - 7));
}

// The parameters that end a residual branch: s·(h·Wᵀ + b) = h·(sW)ᵀ + s·b.
bool is_branch_output(const std::string& name) {
  for (const char* leaf : {".attn.proj.weight", ".attn.proj.bias", ".mlp.proj.weight",
                           ".mlp.proj.bias", ".mlp.down.weight"}) {
    const std::string l = leaf;
    if (name.size() > l.size() && name.compare(name.size() - l.size(), l.size(), l) == 0)
      return true;
  }
  return false;
}

TEST(SdpBlockLevel, ContextSelectsTheWorkersBlocks) {
  for (const Case& cs : kCases) {
    const BlockAssignment a = cover_of(cs);
    for (int w = 0; w < cs.workers; ++w) {
      const LayerContext f = block_masking_context(a, w, true);
      ASSERT_NE(f.blocks, nullptr);
      EXPECT_EQ(f.blocks->held, a.owned_blocks(w));
      EXPECT_EQ(static_cast<int64_t>(f.blocks->held.size()) * cs.workers, cs.k * cs.n_layer);
      EXPECT_DOUBLE_EQ(f.blocks->residual_scale, static_cast<double>(cs.workers) / cs.k);
      EXPECT_TRUE(f.blocks->frozen.empty());
      const LayerContext b = block_masking_context(a, w, false);
      ASSERT_NE(b.blocks, nullptr);
      EXPECT_TRUE(b.blocks->held.empty());  // every block
      EXPECT_EQ(b.blocks->residual_scale, 1.0);
      std::vector<int64_t> unheld;
      for (int64_t l = 0; l < cs.n_layer; ++l) {
        if (!a.holds(w, l)) unheld.push_back(l);
      }
      EXPECT_EQ(b.blocks->frozen, unheld);
    }
    EXPECT_THROW(block_masking_context(a, cs.workers, true), Error);
    EXPECT_THROW(block_masking_context(a, -1, false), Error);
  }
}

// Forward masking's worker w against the full model with the unheld blocks removed by hand and
// the held blocks' branch outputs scaled.
void expect_forward_masking_matches(bool llama, const Case& cs, double dropout) {
  const ModelConfig c = config(llama, cs.n_layer, dropout);
  const BlockAssignment a = cover_of(cs);
  const double s = static_cast<double>(cs.workers) / cs.k;
  Transformer full(c, DType::kF64);
  init_perturbed(full, cs.seed);
  const int64_t B = 2, T = 6;
  const Tensor ids = loom::testing::random_ids(B, T, c.vocab_size, cs.seed + 2);
  const Tensor targets = loom::testing::random_ids(B, T, c.vocab_size, cs.seed + 3);
  const DropoutKey key{cs.seed + 4, 2, 1};
  const DropoutKey* drop = dropout > 0 ? &key : nullptr;
  const auto fp = params_of(full);
  for (int w = 0; w < cs.workers; ++w) {
    SCOPED_TRACE(std::string(llama ? "llama" : "gpt2") + " worker " + std::to_string(w) + " of " +
                 std::to_string(cs.workers) + ", k = " + std::to_string(cs.k) +
                 ", dropout = " + std::to_string(dropout));
    const std::vector<int64_t> held = a.owned_blocks(w);
    Transformer m(c, DType::kF64, {}, block_masking_context(a, w, true));
    EXPECT_EQ(m.held_blocks(), held);
    EXPECT_EQ(m.num_blocks(), cs.n_layer);
    // The worker has exactly the full model's parameters it holds, under the same names.
    std::set<std::string> want_names;
    for (auto& [name, p] : fp) {
      if (holds_parameter(a, w, name, p)) want_names.insert(name);
    }
    std::set<std::string> names;
    for (auto& [name, p] : m.named_parameters()) names.insert(name);
    EXPECT_EQ(names, want_names);
    EXPECT_LT(m.num_parameters(), full.num_parameters());
    copy_parameters(m, full);

    Transformer ref(c, DType::kF64);
    copy_parameters(ref, full);
    {
      autograd::NoGradGuard no_grad;
      for (auto& [name, p] : ref.named_parameters()) {
        const int64_t l = block_in_name(name);
        if (l < 0 || !a.holds(w, l) || !is_branch_output(name)) continue;
        Tensor t = p;
        ops::copy_(t, ops::scale(p, s));
      }
    }
    // The reference by hand: embeddings, the held blocks in order, the head.
    const Tensor pos = Transformer::host_positions(T);
    Tensor x = ref.embed(ids, pos);
    for (int64_t l : held) x = ref.block(l).forward(x, ref.positions(T), drop);
    const Tensor ref_logits = ref.head_logits(x);
    const Tensor ref_loss = ref.head_loss(x, targets);

    EXPECT_LT(rel_error(m.forward(ids, drop), ref_logits), 1e-12) << "logits";
    const Tensor loss = m.loss(ids, targets, drop);
    EXPECT_NEAR(loss.item(), ref_loss.item(), 1e-12 * std::abs(ref_loss.item()));
    autograd::backward(loss);
    autograd::backward(ref_loss);
    const auto rp = params_of(ref);
    int scaled = 0;
    for (auto& [name, p] : m.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      Tensor want = rp.at(name).grad();
      // L(W) = L_ref(s·W) for a branch output W: dL/dW = s·dL_ref/dW_ref.
      if (is_branch_output(name)) {
        want = ops::scale(want, s);
        ++scaled;
      }
      EXPECT_LT(rel_error(p.grad(), want), 1e-12) << name;
    }
    // attn.proj, mlp.proj with their biases (gpt2) or attn.proj, mlp.down (llama), per block.
    EXPECT_EQ(scaled, static_cast<int>(held.size()) * (llama ? 2 : 4));
  }
}

TEST(SdpBlockLevel, ForwardMaskingMatchesTheFullModelWithBlocksRemovedGpt2) {
  for (const Case& cs : kCases) expect_forward_masking_matches(false, cs, 0.0);
  expect_forward_masking_matches(false, kCases[0], 0.2);  // the masks follow the global index
}

TEST(SdpBlockLevel, ForwardMaskingMatchesTheFullModelWithBlocksRemovedLlama) {
  for (const Case& cs : kCases) expect_forward_masking_matches(true, cs, 0.0);
  expect_forward_masking_matches(true, kCases[1], 0.2);
}

// The held blocks and everything after them (ln_f / norm_f, lm_head) draw the full model's
// values, and the generator ends where the full model's does.
TEST(SdpBlockLevel, InitOfHeldBlocksAndHeadIsTheFullModels) {
  for (bool llama : {false, true}) {
    for (const Case& cs : kCases) {
      const ModelConfig c = config(llama, cs.n_layer);
      const BlockAssignment a = cover_of(cs);
      Transformer full(c, DType::kF64);
      Generator g0(cs.seed + 50);
      full.init_weights(g0);
      const auto fp = params_of(full);
      for (int w = 0; w < cs.workers; ++w) {
        for (bool forward : {true, false}) {
          Transformer m(c, DType::kF64, {}, block_masking_context(a, w, forward));
          Generator g(cs.seed + 50);
          m.init_weights(g);
          EXPECT_EQ(g.state().offset, g0.state().offset);
          int blocks = 0;
          for (auto& [name, p] : m.named_parameters()) {
            EXPECT_EQ(p.to_vector(), fp.at(name).to_vector()) << name << " worker " << w;
            blocks +=
                block_in_name(name) >= 0 && name.find(".attn.qkv.weight") != std::string::npos;
          }
          EXPECT_EQ(blocks, forward ? static_cast<int>(a.owned_blocks(w).size())
                                    : static_cast<int>(cs.n_layer));
        }
      }
    }
  }
}

// s = 1 with every block (listed, or coverage 1): the default model bit for bit.
TEST(SdpBlockLevel, ScaleOneWithEveryBlockIsTheDefaultModel) {
  for (bool llama : {false, true}) {
    const ModelConfig c = config(llama, 4, 0.1);
    Transformer full(c, DType::kF64);
    Generator g0(21);
    full.init_weights(g0);
    const Tensor ids = loom::testing::random_ids(2, 5, c.vocab_size, 22);
    const Tensor targets = loom::testing::random_ids(2, 5, c.vocab_size, 23);
    const DropoutKey key{3, 1, 0};
    const Tensor full_loss = full.loss(ids, targets, &key);
    autograd::backward(full_loss);
    const auto fp = params_of(full);
    std::vector<LayerContext> contexts;
    LayerContext listed;
    listed.blocks = std::make_shared<BlockSelection>(BlockSelection{{0, 1, 2, 3}, 1.0, {}});
    contexts.push_back(listed);
    CoverOptions o;
    o.workers = 4;
    o.coverage = 1.0;
    o.seed = 3;
    const BlockAssignment one = assign_blocks(o, 4);
    contexts.push_back(block_masking_context(one, 2, true));
    contexts.push_back(block_masking_context(one, 1, false));
    for (const LayerContext& ctx : contexts) {
      Transformer m(c, DType::kF64, {}, ctx);
      Generator g(21);
      m.init_weights(g);
      EXPECT_EQ(m.forward(ids, &key).to_vector(), full.forward(ids, &key).to_vector());
      const Tensor loss = m.loss(ids, targets, &key);
      EXPECT_EQ(loss.item(), full_loss.item());
      autograd::backward(loss);
      ASSERT_EQ(m.named_parameters().size(), fp.size());
      for (auto& [name, p] : m.named_parameters()) {
        EXPECT_EQ(p.to_vector(), fp.at(name).to_vector()) << name;
        ASSERT_TRUE(p.grad().defined()) << name;
        EXPECT_EQ(p.grad().to_vector(), fp.at(name).grad().to_vector()) << name;
      }
    }
  }
}

// Backward masking: the full forward; the blocks not held are frozen (no gradient), the held
// blocks and the replicated parameters get the full model's gradients.
TEST(SdpBlockLevel, BackwardMaskingIsTheFullModelWithUnheldBlocksFrozen) {
  for (bool llama : {false, true}) {
    for (const Case& cs : kCases) {
      const ModelConfig c = config(llama, cs.n_layer);
      const BlockAssignment a = cover_of(cs);
      Transformer full(c, DType::kF64);
      init_perturbed(full, cs.seed);
      const Tensor ids = loom::testing::random_ids(2, 6, c.vocab_size, cs.seed + 2);
      const Tensor targets = loom::testing::random_ids(2, 6, c.vocab_size, cs.seed + 3);
      const Tensor full_loss = full.loss(ids, targets);
      autograd::backward(full_loss);
      const auto fp = params_of(full);
      for (int w = 0; w < cs.workers; ++w) {
        SCOPED_TRACE(std::string(llama ? "llama" : "gpt2") + " worker " + std::to_string(w));
        Transformer m(c, DType::kF64, {}, block_masking_context(a, w, false));
        ASSERT_EQ(m.named_parameters().size(), fp.size());
        copy_parameters(m, full);
        EXPECT_EQ(m.forward(ids).to_vector(), full.forward(ids).to_vector());
        const Tensor loss = m.loss(ids, targets);
        EXPECT_EQ(loss.item(), full_loss.item());
        autograd::backward(loss);
        int frozen = 0;
        for (auto& [name, p] : m.named_parameters()) {
          const int64_t l = block_in_name(name);
          if (l >= 0 && !a.holds(w, l)) {
            ++frozen;
            EXPECT_FALSE(p.requires_grad()) << name;
            EXPECT_FALSE(p.grad().defined()) << name;
            continue;
          }
          EXPECT_TRUE(p.requires_grad()) << name;
          ASSERT_TRUE(p.grad().defined()) << name;
          EXPECT_LT(rel_error(p.grad(), fp.at(name).grad()), 1e-13) << name;
        }
        EXPECT_GT(frozen, 0);
        // Block 0 is held by some worker whose later blocks include a frozen one: the
        // gradient flowed through the frozen blocks to it (checked above for every worker).
      }
    }
  }
}

// The scaled, selected model's backward against finite differences (every parameter).
TEST(SdpBlockLevel, SelectedScaledModelGradcheck) {
  for (bool llama : {false, true}) {
    const ModelConfig c = config(llama, 4);
    LayerContext ctx;
    ctx.blocks = std::make_shared<BlockSelection>(BlockSelection{{1, 3}, 2.5, {}});
    Transformer m(c, DType::kF64, {}, ctx);
    Generator g(8);
    m.init_weights(g);
    loom::testing::perturb_parameters(m, 0.2, 9);
    const Tensor ids = loom::testing::random_ids(2, 4, c.vocab_size, 10);
    loom::testing::expect_gradcheck([&](const std::vector<Tensor>&) { return m.forward(ids); },
                                    m.parameters(), 1e-6, 1e-6, 1e-5, 40);
  }
}

// Note [SDP block slices]: global ids (the same name has the same id on every worker whatever
// blocks it holds), the last block first, a block's parameters in their order, the replicated
// parameters after every block's; holders from the cover.
TEST(SdpBlockLevel, BlockSlicesIdsAndHolders) {
  for (bool llama : {false, true}) {
    for (const Case& cs : kCases) {
      const ModelConfig c = config(llama, cs.n_layer);
      const BlockAssignment a = cover_of(cs);
      Transformer full(c, DType::kF64);
      // The test's own layout: block 0's parameter names inside the block, and the rest.
      std::vector<std::string> in_block, replicated;
      for (auto& [name, p] : full.named_parameters()) {
        const int64_t l = block_in_name(name);
        if (l == 0) in_block.push_back(name.substr(9));
        if (l < 0) replicated.push_back(name);
      }
      const auto P = static_cast<int64_t>(in_block.size());
      std::map<std::string, int64_t> id_of;
      std::set<int64_t> ids_seen;
      std::vector<std::vector<std::pair<std::string, Tensor>>> lists;
      for (int w = 0; w < cs.workers; ++w) {
        lists.push_back(
            Transformer(c, DType::kF64, {}, block_masking_context(a, w, true)).named_parameters());
      }
      lists.push_back(full.named_parameters());  // backward masking's list: every block
      for (const auto& params : lists) {
        const std::vector<SdpSliceSpec> slices = block_slices(a, params);
        ASSERT_EQ(slices.size(), params.size());
        std::set<size_t> covered;
        for (size_t j = 0; j < slices.size(); ++j) {
          const SdpSliceSpec& s = slices[j];
          if (j > 0) {
            EXPECT_LT(slices[j - 1].id, s.id);
          }
          ASSERT_LT(s.param, params.size());
          covered.insert(s.param);
          EXPECT_EQ(s.length, -1);
          const std::string& name = params[s.param].first;
          const int64_t l = block_in_name(name);
          int64_t want;
          if (l >= 0) {
            const auto at =
                std::find(in_block.begin(), in_block.end(), name.substr(name.find('.', 7) + 1));
            ASSERT_NE(at, in_block.end()) << name;
            want = (cs.n_layer - 1 - l) * P + (at - in_block.begin());
            EXPECT_EQ(s.holders, a.holders[static_cast<size_t>(l)]) << name;
            EXPECT_EQ(static_cast<int>(s.holders.size()), cs.k) << name;
          } else {
            const auto at = std::find(replicated.begin(), replicated.end(), name);
            ASSERT_NE(at, replicated.end()) << name;
            want = cs.n_layer * P + (at - replicated.begin());
            EXPECT_EQ(static_cast<int>(s.holders.size()), cs.workers) << name;
            for (int r = 0; r < cs.workers; ++r) {
              EXPECT_EQ(s.holders[static_cast<size_t>(r)], r);
            }
          }
          EXPECT_EQ(s.id, want) << name;
          // The same name has the same id in every list.
          const auto [it, inserted] = id_of.emplace(name, s.id);
          EXPECT_EQ(it->second, s.id) << name;
          ids_seen.insert(s.id);
        }
        EXPECT_EQ(covered.size(), params.size());
      }
      // Over every list, the ids are exactly 0 … n_layer·P + R − 1, one per name.
      EXPECT_EQ(ids_seen.size(), id_of.size());
      EXPECT_EQ(static_cast<int64_t>(ids_seen.size()),
                cs.n_layer * P + static_cast<int64_t>(replicated.size()));
      EXPECT_EQ(*ids_seen.rbegin(), static_cast<int64_t>(ids_seen.size()) - 1);
      // The last block's parameters come first.
      EXPECT_EQ(block_in_name(lists.back()[block_slices(a, lists.back())[0].param].first),
                cs.n_layer - 1);
    }
  }
}

TEST(SdpBlockLevel, BlockSlicesErrorsAndHoldings) {
  const Case cs = kCases[0];
  const BlockAssignment a = cover_of(cs);
  const ModelConfig c = config(false, cs.n_layer);
  Transformer full(c, DType::kF64);
  auto params = full.named_parameters();
  for (int w = 0; w < cs.workers; ++w) {
    for (auto& [name, p] : params) {
      const int64_t l = block_in_name(name);
      EXPECT_EQ(holds_parameter(a, w, name, p), l < 0 || a.holds(w, l)) << name;
    }
  }
  // A tensor that is no model's parameter (no role), and a block outside the cover's n_layer.
  EXPECT_THROW(holds_parameter(a, 0, "loose", Tensor::zeros({2})), Error);
  Tensor outside = Tensor::zeros({2});
  outside.set_role({ParamRole::Part::kBlock, cs.n_layer, "attn.qkv.weight"});
  EXPECT_THROW(holds_parameter(a, 0, "outside", outside), Error);
  EXPECT_THROW(holds_parameter(a, cs.workers, "wte.weight", full.wte_weight()), Error);
  // A block that lists other parameters than the others.
  auto bad = params;
  bad.erase(std::find_if(bad.begin(), bad.end(),
                         [](const auto& np) { return np.first == "blocks.2.ln_2.bias"; }));
  try {
    block_slices(a, bad);
    ADD_FAILURE() << "no error for blocks with different parameters";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.2"), std::string::npos) << e.what();
  }
  // Replicated parameters with no block to place their ids after.
  std::vector<std::pair<std::string, Tensor>> only_rest;
  for (auto& np : params) {
    if (block_in_name(np.first) < 0) only_rest.push_back(np);
  }
  EXPECT_THROW(block_slices(a, only_rest), Error);
  EXPECT_TRUE(block_slices(a, {}).empty());
}

struct RecordingHooks final : UnitHooks {
  void before_forward(int) override {}
  Tensor after_forward(int, const Tensor& out) override { return out; }
};

// Selection errors; block(i) and the parameter units of a selected model.
TEST(SdpBlockLevel, SelectionErrorsAndUnits) {
  const ModelConfig c = config(true, 4);
  auto build = [&](BlockSelection s) {
    LayerContext ctx;
    ctx.blocks = std::make_shared<BlockSelection>(std::move(s));
    return std::make_unique<Transformer>(c, DType::kF64, Device{}, ctx);
  };
  EXPECT_THROW(build({{2, 1}, 1.0, {}}), Error);      // not ascending
  EXPECT_THROW(build({{1, 1}, 1.0, {}}), Error);      // repeated
  EXPECT_THROW(build({{0, 4}, 1.0, {}}), Error);      // out of range
  EXPECT_THROW(build({{-1, 2}, 1.0, {}}), Error);     // out of range
  EXPECT_THROW(build({{1, 3}, 1.0, {2}}), Error);     // frozen but not held
  EXPECT_THROW(build({{1, 3}, 1.0, {3, 1}}), Error);  // frozen not ascending
  EXPECT_THROW(build({{1, 3}, 0.0, {}}), Error);      // scale
  EXPECT_THROW(build({{1, 3}, -2.0, {}}), Error);
  const auto m = build({{1, 3}, 2.0, {3}});
  EXPECT_EQ(m->num_blocks(), 4);
  EXPECT_TRUE(m->holds_block(1));
  EXPECT_FALSE(m->holds_block(0));
  EXPECT_FALSE(m->holds_block(4));
  EXPECT_EQ(m->block(3).residual_scale(), 2.0);
  EXPECT_THROW(m->block(2), Error);
  for (auto& [name, p] : m->named_parameters()) {
    EXPECT_EQ(p.requires_grad(), block_in_name(name) != 3) << name;
  }
  const auto units = m->parameter_units();
  ASSERT_EQ(units.size(), 6u);  // embeddings, 4 blocks, head
  for (int64_t l = 0; l < 4; ++l) {
    const auto& unit = units[static_cast<size_t>(l + 1)];
    EXPECT_EQ(unit.empty(), l == 0 || l == 2) << l;
    for (const auto& [name, p] : unit) EXPECT_EQ(block_in_name(name), l) << name;
  }
  EXPECT_FALSE(units[0].empty());
  EXPECT_FALSE(units[5].empty());
  RecordingHooks hooks;
  EXPECT_THROW(m->set_unit_hooks(&hooks), Error);
  m->set_unit_hooks(nullptr);  // clearing is fine
  // With every block held the hooks are accepted.
  const auto all = build({{}, 1.0, {}});
  all->set_unit_hooks(&hooks);
  all->set_unit_hooks(nullptr);
  // A selected model runs the held blocks of any range: [0, 2) runs block 1 alone.
  Generator g(1);
  m->init_weights(g);
  const Tensor ids = loom::testing::random_ids(1, 3, c.vocab_size, 2);
  const Tensor x = m->embed(ids, Transformer::host_positions(3));
  const Tensor pos = m->positions(3);
  EXPECT_EQ(m->run_blocks(x, pos, 0, 2, nullptr).to_vector(),
            m->block(1).forward(x, pos).to_vector());
  EXPECT_EQ(m->run_blocks(x, pos, 2, 3, nullptr).to_vector(), x.to_vector());  // none held
}

}  // namespace
}  // namespace loom::parallel::sdp
