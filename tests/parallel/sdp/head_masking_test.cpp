// tests/parallel/sdp/head_masking_test.cpp — SDP forward masking's heads option (Note [SDP packed
// heads] in parallel/sdp/forward_masking.h, Note [SDP head slices] in parallel/sdp/head_slices.h)
// in one process, f64, a GPT-2 with 8 heads and Llamas with 4 and 8 kv groups (GQA, 2 query
// heads each), every worker of N = 4 (k = 2, 3) and N = 8 (k = 2, 4): after the same init a
// worker's packed attention weights are the owned kv groups' q, k, v rows and query columns of
// the default model's; its logits, loss and gradients equal a reference built from the default
// model (the unheld query heads' proj columns zeroed and proj scaled by N/k, and the MLP's unheld
// units zeroed, its output projection scaled); the average of the workers' attention outputs is
// the full attention's; coverage 1 is the default model bit for bit; head_slices names each
// slice's pieces with the same id and shape on exactly its holders, covering exactly the packed
// rows/columns, the last block first, and sdp_slices leaves the packed attention to it; the
// head-packed attention's backward against finite differences; the factory's errors. Under
// backward masking (Note [SDP backward-masked heads]): the trained parts are forward masking's
// packed ones and the frozen copies (listed by frozen_parameters under the global names) the
// other groups', rebuilding the default model through their placements; every worker computes
// the full model (logits, loss) with the full gradients' held rows / columns and no gradient for
// the frozen copies; proj must read qkv's head order; coverage 1 is the default model;
// head_slices(held = false) and neuron_setup's frozen slices use the holders' ids; gradcheck.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/view.h"
#include "core/tensor_piece.h"
#include "layers/attention.h"
#include "layers/transformer.h"
#include "parallel/sdp/backward_masking.h"
#include "parallel/sdp/forward_masking.h"
#include "parallel/sdp/head_slices.h"
#include "parallel/sdp/sdp_sync.h"
#include "tests/gradcheck.h"
#include "tests/layers/tiny_models.h"
#include "tests/parallel/sdp/sdp_test_util.h"

namespace loom::parallel::sdp {
namespace {

using loom::testing::rel_error;
using namespace test_util;  // NOLINT(build/namespaces): the shared test helpers

// A model with enough kv groups for 8 workers: GPT-2 (8 heads of 4), Llama with 4 kv groups
// (8 query heads of 4) or 8 (16 query heads of 2).
ModelConfig heads_config(bool llama, int64_t kv_groups) {
  ModelConfig c = config(llama);
  c.n_embd = 32;
  if (llama) {
    c.n_kv_head = kv_groups;
    c.n_head = 2 * kv_groups;
  } else {
    c.n_head = kv_groups;
  }
  return c;
}

struct HeadCase {
  bool llama;
  int64_t kv_groups;
  NeuronCase cover;
};

const std::vector<HeadCase> kCases = {
    {false, 8, {4, 2, 1}}, {false, 8, {4, 3, 5}}, {false, 8, {8, 2, 3}}, {false, 8, {8, 4, 7}},
    {true, 4, {4, 2, 2}},  {true, 4, {4, 3, 9}},  {true, 8, {8, 2, 4}},  {true, 8, {8, 4, 6}}};

std::string describe(const HeadCase& h) {
  return std::string(h.llama ? "llama" : "gpt2") + " groups " + std::to_string(h.kv_groups) +
         " N " + std::to_string(h.cover.workers) + " k " + std::to_string(h.cover.k);
}

// The heads cover of c: one layer of c.kv_heads() groups per block, from seed + 1 (so that it
// differs from the MLP cover's).
NeuronAssignment heads_of(const ModelConfig& c, int workers, int k, uint64_t seed) {
  CoverOptions o;
  o.workers = workers;
  o.coverage = static_cast<double>(k) / workers;
  o.seed = seed + 1;
  return assign_neurons(o, std::vector<int64_t>(static_cast<size_t>(c.n_layer), c.kv_heads()),
                        "model.n_kv_head");
}

// The block index and leaf ("qkv.weight", "proj.bias", …) of an attention parameter, or -1.
int64_t attn_param(const std::string& name, std::string* leaf) {
  if (name.rfind("blocks.", 0) != 0) return -1;
  const size_t at = name.find(".attn.", 7);
  if (at == std::string::npos) return -1;
  *leaf = name.substr(at + 6);
  return std::stoll(name.substr(7, name.find('.', 7) - 7));
}

// The test's own reading of a name: a block's attention parameter that the heads option packs
// (qkv weight and bias, proj weight); the library asks the parameter's role instead.
bool packed_head_name(const std::string& name) {
  std::string leaf;
  return attn_param(name, &leaf) >= 0 &&
         (leaf == "qkv.weight" || leaf == "qkv.bias" || leaf == "proj.weight");
}

// The test's own rows of the fused qkv (Note [Fused qkv layout]) that kv groups `groups` own:
// their query heads' rows, then their k rows, then their v rows.
std::vector<int64_t> qkv_rows(const ModelConfig& c, const std::vector<int64_t>& groups) {
  const int64_t d = c.head_dim(), g = c.n_head / c.kv_heads(), q = c.n_head * d,
                kv = c.kv_heads() * d;
  std::vector<int64_t> rows;
  for (int64_t u : groups)
    for (int64_t r = u * g * d; r < (u + 1) * g * d; ++r) rows.push_back(r);
  for (int64_t base : {q, q + kv})
    for (int64_t u : groups)
      for (int64_t r = u * d; r < (u + 1) * d; ++r) rows.push_back(base + r);
  return rows;
}

// The proj columns of the query heads of kv groups `groups`.
std::vector<int64_t> proj_cols(const ModelConfig& c, const std::vector<int64_t>& groups) {
  const int64_t qd = c.n_head / c.kv_heads() * c.head_dim();
  std::vector<int64_t> cols;
  for (int64_t u : groups)
    for (int64_t j = u * qd; j < (u + 1) * qd; ++j) cols.push_back(j);
  return cols;
}

bool is_mlp_in(const std::string& leaf) {
  return leaf == "fc.weight" || leaf == "fc.bias" || leaf == "gate.weight" || leaf == "up.weight";
}
bool is_mlp_out(const std::string& leaf) { return leaf == "proj.weight" || leaf == "down.weight"; }

// What worker w's parameter `name` holds of the full tensor `full`.
Tensor expected_part(const ModelConfig& c, const std::string& name, const Tensor& full,
                     const NeuronAssignment& mlp, const NeuronAssignment& heads, int w) {
  std::string leaf;
  int64_t l = mlp_param(name, &leaf);
  if (l >= 0) {
    const std::vector<int64_t> owned = mlp.owned_units(w, static_cast<int>(l));
    if (is_mlp_in(leaf)) return units_of(full, 0, owned);
    if (is_mlp_out(leaf)) return units_of(full, 1, owned);
    return full;
  }
  l = attn_param(name, &leaf);
  if (l < 0) return full;
  const std::vector<int64_t> groups = heads.owned_units(w, static_cast<int>(l));
  if (leaf == "qkv.weight" || leaf == "qkv.bias") return units_of(full, 0, qkv_rows(c, groups));
  if (leaf == "proj.weight") return units_of(full, 1, proj_cols(c, groups));
  return full;  // proj.bias: whole
}

// Whether a parameter's gradient is scaled by N/k in the worker (the scaled output projections).
bool is_scaled(const std::string& name) {
  std::string leaf;
  if (mlp_param(name, &leaf) >= 0) return is_mlp_out(leaf);
  return attn_param(name, &leaf) >= 0 && leaf == "proj.weight";
}

// A copy of the full model as worker w computes it: the MLP's unowned units' input rows zeroed,
// its output projection scaled by N/k; the unowned query heads' proj columns zeroed and proj
// scaled by N/k (a head with zero proj columns contributes nothing).
void make_reference(const ModelConfig& c, const Module& ref, const NeuronAssignment& mlp,
                    const NeuronAssignment& heads, int w) {
  autograd::NoGradGuard no_grad;
  const double scale = static_cast<double>(mlp.workers) / mlp.replication;
  for (auto& [name, p] : ref.named_parameters()) {
    std::string leaf;
    double* d = p.data<double>();
    const int64_t cols = p.dim() == 2 ? p.size(1) : 1;
    if (const int64_t l = mlp_param(name, &leaf); l >= 0) {
      const std::vector<int64_t> owned = mlp.owned_units(w, static_cast<int>(l));
      const std::set<int64_t> keep(owned.begin(), owned.end());
      if (is_mlp_in(leaf)) {
        for (int64_t u = 0; u < p.size(0); ++u)
          if (keep.count(u) == 0)
            for (int64_t j = 0; j < cols; ++j) d[u * cols + j] = 0.0;
      } else if (is_mlp_out(leaf)) {
        for (int64_t i = 0; i < p.numel(); ++i) d[i] *= scale;
      }
    } else if (const int64_t la = attn_param(name, &leaf); la >= 0 && leaf == "proj.weight") {
      const std::vector<int64_t> held = proj_cols(c, heads.owned_units(w, static_cast<int>(la)));
      const std::set<int64_t> keep(held.begin(), held.end());
      for (int64_t r = 0; r < p.size(0); ++r)
        for (int64_t j = 0; j < cols; ++j)
          d[r * cols + j] = keep.count(j) ? d[r * cols + j] * scale : 0.0;
    }
  }
}

LayerContext worker_context(const NeuronAssignment& mlp, const NeuronAssignment& heads, int w) {
  return forward_masking_context(mlp, w, heads);
}

TEST(SdpHeadMasking, InitKeepsTheDefaultModelsOwnedHeads) {
  for (const HeadCase& h : kCases) {
    SCOPED_TRACE(describe(h));
    const ModelConfig c = heads_config(h.llama, h.kv_groups);
    const NeuronAssignment mlp = cover_of(c, h.cover.workers, h.cover.k, h.cover.seed);
    const NeuronAssignment heads = heads_of(c, h.cover.workers, h.cover.k, h.cover.seed);
    Transformer full(c, DType::kF64);
    Generator g0(h.cover.seed + 100);
    full.init_weights(g0);
    const auto fp = params_of(full);
    const int64_t g = c.n_head / c.kv_heads(), d = c.head_dim();
    for (int w = 0; w < h.cover.workers; ++w) {
      SCOPED_TRACE("worker " + std::to_string(w));
      Transformer m(c, DType::kF64, {}, worker_context(mlp, heads, w));
      Generator gen(h.cover.seed + 100);
      m.init_weights(gen);
      const auto mp = params_of(m);
      ASSERT_EQ(mp.size(), fp.size());
      for (auto& [name, p] : mp) {
        const Tensor want = expected_part(c, name, fp.at(name), mlp, heads, w);
        ASSERT_EQ(p.shape(), want.shape()) << name;
        EXPECT_EQ(p.to_vector(), want.to_vector()) << name;
      }
      // The attention shrinks: |O| of the U groups, (g + 2)·D qkv rows each.
      for (int64_t l = 0; l < c.n_layer; ++l) {
        const int64_t owned = heads.layers[static_cast<size_t>(l)].owned_count(w);
        const std::string b = "blocks." + std::to_string(l) + ".attn.";
        EXPECT_EQ(mp.at(b + "qkv.weight").size(0), owned * (g + 2) * d);
        EXPECT_EQ(mp.at(b + "proj.weight").size(1), owned * g * d);
        if (h.cover.k < h.cover.workers) {
          EXPECT_LT(owned, c.kv_heads());
        }
      }
    }
  }
}

TEST(SdpHeadMasking, ForwardAndGradientsMatchTheMaskedScaledReference) {
  for (const HeadCase& h : kCases) {
    SCOPED_TRACE(describe(h));
    const ModelConfig c = heads_config(h.llama, h.kv_groups);
    const NeuronCase& cs = h.cover;
    const NeuronAssignment mlp = cover_of(c, cs.workers, cs.k, cs.seed);
    const NeuronAssignment heads = heads_of(c, cs.workers, cs.k, cs.seed);
    const double scale = static_cast<double>(cs.workers) / cs.k;
    Transformer full(c, DType::kF64);
    init_perturbed(full, cs.seed);
    const auto fp = params_of(full);
    const Tensor ids = loom::testing::random_ids(2, 6, c.vocab_size, cs.seed + 2);
    const Tensor targets = loom::testing::random_ids(2, 6, c.vocab_size, cs.seed + 3);
    for (int w = 0; w < cs.workers; ++w) {
      SCOPED_TRACE("worker " + std::to_string(w));
      Transformer m(c, DType::kF64, {}, worker_context(mlp, heads, w));
      for (auto& [name, p] : m.named_parameters()) load_through_piece(name, p, fp);
      Transformer ref(c, DType::kF64);
      copy_parameters(ref, full);
      make_reference(c, ref, mlp, heads, w);

      EXPECT_LT(rel_error(m.forward(ids), ref.forward(ids)), 1e-12) << "logits";
      const Tensor loss = m.loss(ids, targets), ref_loss = ref.loss(ids, targets);
      EXPECT_NEAR(loss.item(), ref_loss.item(), 1e-12 * std::abs(ref_loss.item()));
      // The worker is not the full model (else the comparison above says little).
      EXPECT_GT(std::abs(loss.item() - full.loss(ids, targets).item()), 1e-9);
      autograd::backward(loss);
      autograd::backward(ref_loss);
      const auto rp = params_of(ref);
      for (auto& [name, p] : m.named_parameters()) {
        ASSERT_TRUE(p.grad().defined()) << name;
        Tensor want = expected_part(c, name, rp.at(name).grad(), mlp, heads, w);
        // dL/dW_packed = (N/k)·dL/dW_ref for a scaled projection (W_ref = (N/k)·W).
        if (is_scaled(name)) want = ops::scale(want, scale);
        EXPECT_LT(rel_error(p.grad(), want), 1e-12) << name;
      }
    }
  }
}

TEST(SdpHeadMasking, CoverageOneIsTheDefaultModel) {
  for (const HeadCase& h : {kCases[0], kCases[4]}) {
    SCOPED_TRACE(describe(h));
    const ModelConfig c = heads_config(h.llama, h.kv_groups);
    const int n = h.cover.workers;
    const NeuronAssignment mlp = cover_of(c, n, n, 5), heads = heads_of(c, n, n, 5);
    const FullRun full(c, 21, 5, 22);
    for (int w = 0; w < n; ++w) {
      Transformer m(c, DType::kF64, {}, worker_context(mlp, heads, w));
      Generator g(21);
      m.init_weights(g);
      expect_is_full_model(m, full);
    }
  }
}

// Decision 2 of docs/parallel.md for the heads: the average over the N workers of their
// attention outputs is the full attention's output.
TEST(SdpHeadMasking, WorkersAverageToTheFullAttention) {
  for (const HeadCase& h : kCases) {
    SCOPED_TRACE(describe(h));
    const ModelConfig c = heads_config(h.llama, h.kv_groups);
    const NeuronCase& cs = h.cover;
    const NeuronAssignment mlp = cover_of(c, cs.workers, cs.k, cs.seed);
    const NeuronAssignment heads = heads_of(c, cs.workers, cs.k, cs.seed);
    const int64_t layer = c.n_layer - 1, T = 5;
    CausalSelfAttention full(c, DType::kF64);
    Generator g(cs.seed);
    full.init(g, 0.3, 0.2);
    loom::testing::perturb_parameters(full, 0.1, cs.seed + 1);
    const auto fp = params_of(full);
    Generator gx(cs.seed + 2);
    const Tensor x = randn({2, T, c.n_embd}, gx, DType::kF64);
    const Tensor pos = Transformer::host_positions(T);
    Tensor sum;
    for (int w = 0; w < cs.workers; ++w) {
      const CausalSelfAttention part(c, DType::kF64, {}, worker_context(mlp, heads, w), layer);
      for (auto& [name, p] : part.named_parameters()) load_through_piece(name, p, fp);
      const Tensor y = part.forward(x, pos);
      sum = sum.defined() ? ops::add(sum, y) : y;
    }
    EXPECT_LT(rel_error(ops::scale(sum, 1.0 / cs.workers), full.forward(x, pos)), 1e-12);
  }
}

// The global index range [begin, end) along `dim` of parameter p that local [local, local + len)
// holds, through its kAxisSdp runs (the test fails when no run holds it whole).
std::pair<int64_t, int64_t> global_range(const Tensor& p, int64_t local, int64_t len) {
  const Placement placement = p.placement();  // by value: split points into it
  const PlacementSplit* split = placement.split_over(kAxisSdp);
  EXPECT_NE(split, nullptr);
  if (split == nullptr) return {-1, -1};
  for (const PlacementRun& r : split->runs) {
    if (local >= r.local && local + len <= r.local + r.length)
      return {r.global + local - r.local, r.global + local - r.local + len};
  }
  ADD_FAILURE() << "local [" << local << ", " << local + len << ") is in no run";
  return {-1, -1};
}

TEST(SdpHeadMasking, HeadSlicesAgreeAcrossWorkersAndCoverThePackedHeads) {
  const int64_t base = 1000;
  for (const HeadCase& h : kCases) {
    SCOPED_TRACE(describe(h));
    const ModelConfig c = heads_config(h.llama, h.kv_groups);
    const NeuronCase& cs = h.cover;
    const int n = cs.workers;
    const NeuronAssignment mlp = cover_of(c, n, cs.k, cs.seed);
    const NeuronAssignment heads = heads_of(c, n, cs.k, cs.seed);
    const int64_t per_block = h.llama ? 4 : 7;  // Note [SDP head slices]: P
    const int64_t g = c.n_head / c.kv_heads(), d = c.head_dim(), q = c.n_head * d,
                  kv = c.kv_heads() * d;
    struct Seen {
      std::string name;
      int64_t dim, length;
      std::vector<int> workers, holders;
    };
    std::map<int64_t, Seen> seen;
    for (int w = 0; w < n; ++w) {
      SCOPED_TRACE("worker " + std::to_string(w));
      const Transformer m(c, DType::kF64, {}, worker_context(mlp, heads, w));
      const auto params = m.named_parameters();
      EXPECT_EQ(head_slice_id_span(heads, params), c.n_layer * n * per_block);
      const std::vector<SdpSliceSpec> specs = head_slices(heads, w, params, base);
      int64_t expected_count = 0;
      for (int64_t l = 0; l < c.n_layer; ++l)
        expected_count +=
            static_cast<int64_t>(heads.layers[static_cast<size_t>(l)].slices_of(w).size()) *
            per_block;
      EXPECT_EQ(static_cast<int64_t>(specs.size()), expected_count);
      std::map<size_t, std::vector<int>> covered;  // per parameter, per local index along dim
      int64_t last_id = -1, last_block = c.n_layer;
      for (const SdpSliceSpec& s : specs) {
        ASSERT_LT(s.param, params.size());
        const auto& [name, p] = params[s.param];
        EXPECT_GT(s.id, last_id) << "ascending ids";
        last_id = s.id;
        ASSERT_GE(s.id, base);
        ASSERT_LT(s.id, base + c.n_layer * n * per_block);
        // id − base = ((n_layer − 1 − l)·N + s)·P + p.
        const int64_t rel = s.id - base, piece = rel % per_block;
        const int slice = static_cast<int>(rel / per_block % n);
        const int64_t l = c.n_layer - 1 - rel / per_block / n;
        EXPECT_LE(l, last_block) << "the last block first";
        last_block = l;
        std::string leaf;
        ASSERT_EQ(attn_param(name, &leaf), l) << name;
        const LayerCover& cover = heads.layers[static_cast<size_t>(l)];
        EXPECT_TRUE(cover.holds(w, slice));
        const UnitSlice& us = cover.slices[static_cast<size_t>(slice)];
        EXPECT_EQ(s.holders, us.holders);
        // The piece's global rows / columns, from the test's own layout.
        std::pair<int64_t, int64_t> want;
        const int64_t q_piece = h.llama ? piece : piece % 3;
        if (piece < 3 || (!h.llama && piece < 6)) {
          EXPECT_EQ(leaf, piece < 3 ? "qkv.weight" : "qkv.bias");
          EXPECT_EQ(s.dim, 0);
          const int64_t at[3] = {0, q, q + kv}, per[3] = {g * d, d, d};
          want = {at[q_piece] + us.begin * per[q_piece], at[q_piece] + us.end * per[q_piece]};
        } else {
          EXPECT_EQ(leaf, "proj.weight");
          EXPECT_EQ(s.dim, 1);
          want = {us.begin * g * d, us.end * g * d};
        }
        EXPECT_EQ(global_range(p, s.local_begin, s.length), want) << name << " id " << s.id;
        auto& cov = covered[s.param];
        cov.resize(static_cast<size_t>(p.size(s.dim)), 0);
        for (int64_t i = s.local_begin; i < s.local_begin + s.length; ++i)
          ++cov[static_cast<size_t>(i)];
        auto [it, fresh] = seen.emplace(s.id, Seen{name, s.dim, s.length, {}, s.holders});
        if (!fresh) {
          EXPECT_EQ(it->second.name, name);
          EXPECT_EQ(it->second.dim, s.dim);
          EXPECT_EQ(it->second.length, s.length);
          EXPECT_EQ(it->second.holders, s.holders);
        }
        it->second.workers.push_back(w);
      }
      // Every packed attention parameter's rows (columns) covered exactly once.
      int packed = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        if (!packed_head_name(params[i].first)) continue;
        ++packed;
        ASSERT_TRUE(covered.count(i)) << params[i].first;
        for (int count : covered[i]) EXPECT_EQ(count, 1) << params[i].first;
      }
      EXPECT_EQ(packed, c.n_layer * (h.llama ? 2 : 3));
      // sdp_slices leaves the packed attention to head_slices and lists everything else.
      std::set<size_t> listed;
      for (const SdpSliceSpec& s : sdp_slices(mlp, w, params)) {
        EXPECT_FALSE(packed_head_name(params[s.param].first)) << params[s.param].first;
        listed.insert(s.param);
        if (params[s.param].first.find(".attn.proj.bias") != std::string::npos) {
          EXPECT_EQ(s.length, -1);
          EXPECT_EQ(static_cast<int>(s.holders.size()), n);
        }
      }
      for (size_t i = 0; i < params.size(); ++i)
        EXPECT_EQ(listed.count(i) == 1, !packed_head_name(params[i].first)) << params[i].first;
    }
    // Every id on exactly its holders.
    EXPECT_EQ(static_cast<int64_t>(seen.size()),
              c.n_layer * n * per_block);  // every slice of every block has holders
    for (const auto& [id, s] : seen) EXPECT_EQ(s.workers, s.holders) << "id " << id;
  }
}

// The head-packed attention's backward (input and parameters) against finite differences, with
// RoPE and GQA (Llama) and with biases (GPT-2), at a worker whose groups wrap (two ranges) when
// one does.
TEST(SdpHeadMasking, PackedAttentionGradcheck) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    const ModelConfig c = heads_config(llama, 4);
    const NeuronAssignment mlp = cover_of(c, 4, 2, 3), heads = heads_of(c, 4, 2, 3);
    int w = 0;
    for (int v = 0; v < 4; ++v)
      if (heads.layers[0].owned_ranges(v).size() == 2) w = v;
    CausalSelfAttention attn(c, DType::kF64, {}, worker_context(mlp, heads, w), 0);
    Generator g(4);
    attn.init(g, 0.3, 0.3);
    loom::testing::perturb_parameters(attn, 0.1, 5);
    const Tensor x = loom::testing::random({1, 3, c.n_embd}, g);
    const Tensor pos = Transformer::host_positions(3);
    std::vector<Tensor> inputs = {x};
    for (const Tensor& p : attn.parameters()) inputs.push_back(p);
    loom::testing::expect_gradcheck(
        [&](const std::vector<Tensor>& in) { return attn.forward(in[0], pos); }, inputs);
  }
}

TEST(SdpHeadMasking, FactoryErrors) {
  const ModelConfig c = heads_config(true, 4);
  const NeuronAssignment mlp = cover_of(c, 4, 2, 1), heads = heads_of(c, 4, 2, 1);
  // A heads cover of other workers or replication than the MLP cover's.
  EXPECT_THROW(ForwardMaskingLinear(mlp, 0, heads_of(c, 2, 2, 1)), Error);
  EXPECT_THROW(ForwardMaskingLinear(mlp, 0, heads_of(c, 4, 3, 1)), Error);
  // A model deeper than the heads cover.
  ModelConfig deeper = c;
  deeper.n_layer = c.n_layer + 1;
  CoverOptions o{4, 0.5, 1};
  const NeuronAssignment deep_mlp = assign_neurons(
      o, std::vector<int64_t>(static_cast<size_t>(deeper.n_layer), deeper.ffn_hidden_size()));
  EXPECT_THROW(Transformer(deeper, DType::kF64, {}, forward_masking_context(deep_mlp, 0, heads)),
               Error);
  // A heads cover whose groups do not divide the kv heads (5 groups of 4 kv heads).
  const NeuronAssignment five =
      assign_neurons(o, std::vector<int64_t>(static_cast<size_t>(c.n_layer), 5));
  try {
    Transformer(c, DType::kF64, {}, forward_masking_context(mlp, 0, five));
    ADD_FAILURE() << "no error for a heads cover of 5 groups over 4 kv heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_kv_head"), std::string::npos) << e.what();
  }
  // head_slices of a model built without the heads option.
  const Transformer plain(c, DType::kF64, {}, forward_masking_context(mlp, 0));
  EXPECT_THROW(head_slices(heads, 0, plain.named_parameters(), 0), Error);
  // Without heads the factory builds the default attention.
  const ForwardMaskingLinear f(mlp, 0);
  EXPECT_EQ(f.heads(), nullptr);
  EXPECT_TRUE(f.attn_in(0, 32, {32, 16, 16}, false, DType::kF64, {})->plain());
  EXPECT_EQ(f.attn_in(0, 32, {32, 16, 16}, false, DType::kF64, {})->weight().size(0), 64);
}

// --- The heads option under backward masking (Note [SDP backward-masked heads]) ---

LayerContext backward_context(const NeuronAssignment& mlp, const NeuronAssignment& heads, int w) {
  return backward_masking_context(mlp, w, heads);
}

// The kv groups of block l that worker w does not hold, ascending (the test's own complement).
std::vector<int64_t> unheld_groups(const NeuronAssignment& heads, int w, int64_t l) {
  const std::vector<int64_t> held = heads.owned_units(w, static_cast<int>(l));
  const std::set<int64_t> keep(held.begin(), held.end());
  std::vector<int64_t> out;
  for (int64_t u = 0; u < heads.layers[static_cast<size_t>(l)].units; ++u)
    if (keep.count(u) == 0) out.push_back(u);
  return out;
}

// What worker w's frozen tensor of the split parameter `name` holds of the full tensor `full`
// (the unheld units / groups, ascending), or an undefined tensor for a parameter not split.
Tensor expected_frozen(const ModelConfig& c, const std::string& name, const Tensor& full,
                       const NeuronAssignment& mlp, const NeuronAssignment& heads, int w) {
  std::string leaf;
  int64_t l = mlp_param(name, &leaf);
  if (l >= 0) {
    const std::vector<int64_t> held = mlp.owned_units(w, static_cast<int>(l));
    const std::set<int64_t> keep(held.begin(), held.end());
    std::vector<int64_t> rest;
    for (int64_t u = 0; u < mlp.layers[static_cast<size_t>(l)].units; ++u)
      if (keep.count(u) == 0) rest.push_back(u);
    if (is_mlp_in(leaf)) return units_of(full, 0, rest);
    if (is_mlp_out(leaf)) return units_of(full, 1, rest);
    return Tensor();
  }
  l = attn_param(name, &leaf);
  if (l < 0) return Tensor();
  const std::vector<int64_t> groups = unheld_groups(heads, w, l);
  if (leaf == "qkv.weight" || leaf == "qkv.bias") return units_of(full, 0, qkv_rows(c, groups));
  if (leaf == "proj.weight") return units_of(full, 1, proj_cols(c, groups));
  return Tensor();  // proj.bias: whole
}

// The cases of coverage < 1 (every worker has frozen groups in every block).
std::vector<HeadCase> partial_cases() {
  std::vector<HeadCase> out;
  for (const HeadCase& h : kCases)
    if (h.cover.k < h.cover.workers) out.push_back(h);
  return out;
}

// Copies t's elements through its placement's piece into `global` and adds 1 to `count` for
// each; returns how many it wrote.
int64_t place_into(const Tensor& t, Tensor& global, Tensor& count) {
  const TensorPiece piece = piece_of(t.placement(), t.shape());
  EXPECT_EQ(piece.global_shape, global.shape());
  const int64_t n =
      copy_overlap(piece, t.raw_data(), whole_piece(global.shape()), global.raw_data(), 8);
  Tensor mark = Tensor::zeros(global.shape(), DType::kF64);
  const Tensor ones = Tensor::ones(t.shape(), DType::kF64);
  copy_overlap(piece, ones.raw_data(), whole_piece(mark.shape()), mark.raw_data(), 8);
  autograd::NoGradGuard no_grad;
  ops::add_(count, mark);
  return n;
}

// After the same init, a backward-masked worker's trained attention parameters are forward
// masking's packed ones, its frozen tensors (listed under the global names, requiring no grad)
// the unheld groups' rows / columns, and the two placed by their placements rebuild the default
// model's tensors, each element once.
TEST(SdpBackwardHeadMasking, InitSplitsTheDefaultModel) {
  for (const HeadCase& h : partial_cases()) {
    SCOPED_TRACE(describe(h));
    const ModelConfig c = heads_config(h.llama, h.kv_groups);
    const NeuronAssignment mlp = cover_of(c, h.cover.workers, h.cover.k, h.cover.seed);
    const NeuronAssignment heads = heads_of(c, h.cover.workers, h.cover.k, h.cover.seed);
    Transformer full(c, DType::kF64);
    Generator g0(h.cover.seed + 100);
    full.init_weights(g0);
    const auto fp = params_of(full);
    for (int w = 0; w < h.cover.workers; ++w) {
      SCOPED_TRACE("worker " + std::to_string(w));
      Transformer m(c, DType::kF64, {}, backward_context(mlp, heads, w));
      Generator gen(h.cover.seed + 100);
      m.init_weights(gen);
      const auto frozen = frozen_parameters(m);
      std::map<std::string, Tensor> fz;
      std::vector<std::string> frozen_names, want_names;
      for (auto& [name, t] : frozen) {
        frozen_names.push_back(name);
        fz[name] = t;
      }
      int attn_split = 0;
      for (auto& [name, p] : m.named_parameters()) {
        const Tensor& f = fp.at(name);
        const Tensor want = expected_part(c, name, f, mlp, heads, w);
        ASSERT_EQ(p.shape(), want.shape()) << name;
        EXPECT_EQ(p.to_vector(), want.to_vector()) << name;
        const Tensor want_frozen = expected_frozen(c, name, f, mlp, heads, w);
        if (!want_frozen.defined()) continue;
        want_names.push_back(name);
        EXPECT_EQ(is_packed_head_parameter(p), packed_head_name(name)) << name;  // by role
        if (packed_head_name(name)) ++attn_split;
        ASSERT_EQ(fz.count(name), 1u) << name;
        const Tensor& t = fz.at(name);
        EXPECT_FALSE(t.requires_grad()) << name;
        ASSERT_EQ(t.shape(), want_frozen.shape()) << name;
        EXPECT_EQ(t.to_vector(), want_frozen.to_vector()) << name;
        ASSERT_NE(t.placement().split_over(kAxisSdp), nullptr) << name;
        Tensor global = Tensor::zeros(f.shape(), DType::kF64);
        Tensor count = Tensor::zeros(f.shape(), DType::kF64);
        EXPECT_EQ(place_into(p, global, count), p.numel()) << name;
        EXPECT_EQ(place_into(t, global, count), t.numel()) << name;
        EXPECT_EQ(global.to_vector(), f.to_vector()) << name;
        EXPECT_EQ(count.to_vector(), std::vector<double>(static_cast<size_t>(f.numel()), 1.0))
            << name;
      }
      EXPECT_EQ(frozen_names, want_names);  // named_parameters() order, global names
      EXPECT_EQ(attn_split, c.n_layer * (h.llama ? 2 : 3));
      // The attention computes every head: its layers report the full widths.
      int attentions = 0;
      m.for_each_module([&](const Module& mod) {
        const auto* a = dynamic_cast<const CausalSelfAttention*>(&mod);
        if (a == nullptr) return;
        ++attentions;
        EXPECT_EQ(a->qkv().out_features(), (c.n_head + 2 * c.kv_heads()) * c.head_dim());
        EXPECT_LT(a->qkv().weight().size(0), a->qkv().out_features());
        EXPECT_EQ(a->proj().in_features(), c.n_head * c.head_dim());
      });
      EXPECT_EQ(attentions, c.n_layer);
    }
  }
}

// With the pieces of one full model loaded (trained and frozen parts), every worker computes the
// full model: logits and loss to 1e-12 (nothing scaled, every head computed, only in another
// order); its trained gradients are the full gradients' held rows / columns, in the packed
// shape; the frozen tensors get no gradient.
TEST(SdpBackwardHeadMasking, ForwardAndGradientsMatchTheFullModel) {
  for (const HeadCase& h : partial_cases()) {
    SCOPED_TRACE(describe(h));
    const ModelConfig c = heads_config(h.llama, h.kv_groups);
    const NeuronCase& cs = h.cover;
    const NeuronAssignment mlp = cover_of(c, cs.workers, cs.k, cs.seed);
    const NeuronAssignment heads = heads_of(c, cs.workers, cs.k, cs.seed);
    Transformer full(c, DType::kF64);
    init_perturbed(full, cs.seed);
    const Tensor ids = loom::testing::random_ids(2, 6, c.vocab_size, cs.seed + 2);
    const Tensor targets = loom::testing::random_ids(2, 6, c.vocab_size, cs.seed + 3);
    const Tensor full_logits = full.forward(ids);
    const Tensor full_loss = full.loss(ids, targets);
    autograd::backward(full_loss);
    const auto fp = params_of(full);
    for (int w = 0; w < cs.workers; ++w) {
      SCOPED_TRACE("worker " + std::to_string(w));
      Transformer m(c, DType::kF64, {}, backward_context(mlp, heads, w));
      for (auto& [name, p] : m.named_parameters()) load_through_piece(name, p, fp);
      const auto frozen = frozen_parameters(m);
      for (auto& [name, t] : frozen) load_through_piece(name, t, fp);
      EXPECT_LT(rel_error(m.forward(ids), full_logits), 1e-12) << "logits";
      const Tensor loss = m.loss(ids, targets);
      EXPECT_NEAR(loss.item(), full_loss.item(), 1e-12 * std::abs(full_loss.item()));
      autograd::backward(loss);
      for (auto& [name, p] : m.named_parameters()) {
        ASSERT_TRUE(p.grad().defined()) << name;
        ASSERT_EQ(p.grad().shape(), p.shape()) << name;
        const Tensor want = expected_part(c, name, fp.at(name).grad(), mlp, heads, w);
        ASSERT_EQ(p.grad().shape(), want.shape()) << name;
        EXPECT_LT(rel_error(p.grad(), want), 1e-12) << name;
      }
      int attn = 0;
      for (auto& [name, t] : frozen) {
        attn += is_packed_head_parameter(t) ? 1 : 0;
        EXPECT_FALSE(t.grad().defined()) << name;
      }
      EXPECT_EQ(attn, c.n_layer * (h.llama ? 2 : 3));
    }
  }
}

// A wrong head order in proj (the frozen columns swapped with the held ones) changes the output:
// the equality above depends on proj reading the heads in qkv's permuted order.
TEST(SdpBackwardHeadMasking, ProjMustReadTheHeadsInQkvsOrder) {
  const HeadCase h = kCases[4];  // Llama, 4 groups of 2 query heads, N 4, k 2
  const ModelConfig c = heads_config(h.llama, h.kv_groups);
  const NeuronAssignment mlp = cover_of(c, 4, 2, h.cover.seed);
  const NeuronAssignment heads = heads_of(c, 4, 2, h.cover.seed);
  CausalSelfAttention full(c, DType::kF64);
  Generator g(3);
  full.init(g, 0.3, 0.2);
  loom::testing::perturb_parameters(full, 0.1, 4);
  const auto fp = params_of(full);
  int w = -1;  // a worker whose held groups are not the first ones (held first ≠ ascending)
  for (int v = 0; v < 4 && w < 0; ++v)
    if (heads.owned_units(v, 0).front() != 0) w = v;
  ASSERT_GE(w, 0);
  const CausalSelfAttention part(c, DType::kF64, {}, backward_context(mlp, heads, w), 0);
  for (auto& [name, p] : part.named_parameters()) load_through_piece(name, p, fp);
  for (auto& [name, t] : frozen_parameters(part)) load_through_piece(name, t, fp);
  Generator gx(5);
  const Tensor x = randn({2, 4, c.n_embd}, gx, DType::kF64);
  const Tensor pos = Transformer::host_positions(4);
  const Tensor y = full.forward(x, pos);
  EXPECT_LT(rel_error(part.forward(x, pos), y), 1e-12);
  // proj with its columns in ascending head order instead (the default layer's) disagrees.
  const auto* proj = dynamic_cast<const BackwardMaskedRowLinear*>(&part.proj());
  ASSERT_NE(proj, nullptr);
  const Tensor h_in = randn({2, 4, c.n_head * c.head_dim()}, gx, DType::kF64);
  const Tensor wrong = ops::linear(h_in, fp.at("proj.weight"), Tensor());  // Llama: no bias
  EXPECT_GT(rel_error(proj->forward(h_in), wrong), 1e-3);
}

// Coverage 1: nothing frozen, every layer plain, the default model bit for bit.
TEST(SdpBackwardHeadMasking, CoverageOneIsTheDefaultModel) {
  for (const HeadCase& h : {kCases[0], kCases[4], kCases[6]}) {
    SCOPED_TRACE(describe(h));
    const ModelConfig c = heads_config(h.llama, h.kv_groups);
    const int n = h.cover.workers;
    const NeuronAssignment mlp = cover_of(c, n, n, 5), heads = heads_of(c, n, n, 5);
    const FullRun full(c, 21, 5, 22);
    for (int w = 0; w < n; ++w) {
      Transformer m(c, DType::kF64, {}, backward_context(mlp, heads, w));
      Generator g(21);
      m.init_weights(g);
      EXPECT_TRUE(frozen_parameters(m).empty());
      int masked = 0;
      m.for_each_module([&](const Module& mod) {
        if (const auto* l = dynamic_cast<const BackwardMaskedLinear*>(&mod)) {
          ++masked;
          EXPECT_TRUE(l->plain());
        }
      });
      EXPECT_EQ(masked, static_cast<int>(c.n_layer) * (h.llama ? 5 : 4));
      expect_is_full_model(m, full);
    }
  }
}

// head_slices of the frozen copies (held = false): on each worker the pieces of exactly the
// slices it does not hold, under the holders' ids, with the holders' names, dims, lengths, global
// rows / columns and holder sets; every frozen attention element covered once; each id on every
// worker, held or frozen. neuron_setup merges them into frozen_slices with the same renumbering
// as the trained slices (Note [SDP slice ids with heads]): each frozen id is a holder's trained id.
TEST(SdpBackwardHeadMasking, FrozenHeadSlicesUseTheHoldersIds) {
  const int64_t base = 500;
  for (const HeadCase& h : partial_cases()) {
    SCOPED_TRACE(describe(h));
    const ModelConfig c = heads_config(h.llama, h.kv_groups);
    const NeuronCase& cs = h.cover;
    const int n = cs.workers;
    const NeuronAssignment mlp = cover_of(c, n, cs.k, cs.seed);
    const NeuronAssignment heads = heads_of(c, n, cs.k, cs.seed);
    struct Piece {
      std::string name;
      int64_t dim, length;
      std::pair<int64_t, int64_t> global;
      std::vector<int> holders;
    };
    std::map<int64_t, Piece> held_pieces;  // id → the holders' piece
    std::map<int64_t, std::vector<int>> held_by, frozen_by;
    std::vector<std::map<int64_t, Piece>> frozen_pieces(static_cast<size_t>(n));
    std::map<int64_t, Piece> setup_held;  // neuron_setup's trained ids → piece
    std::vector<std::map<int64_t, Piece>> setup_frozen(static_cast<size_t>(n));
    std::vector<std::unique_ptr<Transformer>> models;
    for (int w = 0; w < n; ++w) {
      SCOPED_TRACE("worker " + std::to_string(w));
      models.push_back(
          std::make_unique<Transformer>(c, DType::kF64, Device{}, backward_context(mlp, heads, w)));
      const Transformer& m = *models.back();
      const auto params = m.named_parameters();
      const auto frozen = frozen_parameters(m);
      for (const SdpSliceSpec& s : head_slices(heads, w, params, base)) {
        const Tensor& p = params[s.param].second;
        held_pieces[s.id] = {params[s.param].first, s.dim, s.length,
                             global_range(p, s.local_begin, s.length), s.holders};
        held_by[s.id].push_back(w);
      }
      const std::vector<SdpSliceSpec> fs = head_slices(heads, w, frozen, base, false);
      EXPECT_FALSE(fs.empty());
      std::map<size_t, std::vector<int>> covered;
      int64_t last_id = -1;
      for (const SdpSliceSpec& s : fs) {
        EXPECT_GT(s.id, last_id);
        last_id = s.id;
        ASSERT_LT(s.param, frozen.size());
        const auto& [name, t] = frozen[s.param];
        EXPECT_TRUE(is_packed_head_parameter(t)) << name;
        EXPECT_EQ(std::count(s.holders.begin(), s.holders.end(), w), 0) << "id " << s.id;
        frozen_pieces[static_cast<size_t>(w)][s.id] = {
            name, s.dim, s.length, global_range(t, s.local_begin, s.length), s.holders};
        frozen_by[s.id].push_back(w);
        auto& cov = covered[s.param];
        cov.resize(static_cast<size_t>(t.size(s.dim)), 0);
        for (int64_t i = s.local_begin; i < s.local_begin + s.length; ++i)
          ++cov[static_cast<size_t>(i)];
      }
      int attn_frozen = 0;
      for (size_t i = 0; i < frozen.size(); ++i) {
        if (!is_packed_head_parameter(frozen[i].second)) continue;
        ++attn_frozen;
        ASSERT_TRUE(covered.count(i)) << frozen[i].first;
        for (int cnt : covered[i]) EXPECT_EQ(cnt, 1) << frozen[i].first;
      }
      EXPECT_EQ(attn_frozen, c.n_layer * (h.llama ? 2 : 3));
      // neuron_setup: trained and frozen slices, the heads merged into both.
      const SdpSetup setup = neuron_setup(mlp, w, params, frozen, false, &heads);
      EXPECT_TRUE(setup.publishes);
      for (const SdpSliceSpec& s : setup.slices) {
        if (s.length < 0) continue;  // replicated
        const Tensor& p = params[s.param].second;
        const Piece piece{params[s.param].first, s.dim, s.length,
                          global_range(p, s.local_begin, s.length), s.holders};
        const auto [it, fresh] = setup_held.emplace(s.id, piece);
        if (!fresh) {
          EXPECT_EQ(it->second.name, piece.name) << "id " << s.id;
          EXPECT_EQ(it->second.global, piece.global) << "id " << s.id;
        }
      }
      for (const SdpSliceSpec& s : setup.frozen_slices) {
        const Tensor& t = setup.frozen[s.param].second;
        setup_frozen[static_cast<size_t>(w)][s.id] = {setup.frozen[s.param].first, s.dim, s.length,
                                                      global_range(t, s.local_begin, s.length),
                                                      s.holders};
      }
    }
    // Each frozen piece is its holders' piece of the same id.
    for (int w = 0; w < n; ++w) {
      for (const auto& [id, f] : frozen_pieces[static_cast<size_t>(w)]) {
        ASSERT_EQ(held_pieces.count(id), 1u) << "id " << id;
        const Piece& p = held_pieces.at(id);
        EXPECT_EQ(f.name, p.name) << "id " << id;
        EXPECT_EQ(f.dim, p.dim) << "id " << id;
        EXPECT_EQ(f.length, p.length) << "id " << id;
        EXPECT_EQ(f.global, p.global) << "id " << id;
        EXPECT_EQ(f.holders, p.holders) << "id " << id;
        EXPECT_EQ(held_by.at(id), p.holders) << "id " << id;
      }
      // neuron_setup's frozen slices (MLP and heads) are trained slices of the same ids.
      int attn = 0;
      for (const auto& [id, f] : setup_frozen[static_cast<size_t>(w)]) {
        ASSERT_EQ(setup_held.count(id), 1u) << "id " << id << " (" << f.name << ")";
        const Piece& p = setup_held.at(id);
        EXPECT_EQ(f.name, p.name) << "id " << id;
        EXPECT_EQ(f.dim, p.dim) << "id " << id;
        EXPECT_EQ(f.length, p.length) << "id " << id;
        EXPECT_EQ(f.global, p.global) << "id " << id;
        EXPECT_EQ(f.holders, p.holders) << "id " << id;
        attn += packed_head_name(f.name) ? 1 : 0;
      }
      EXPECT_EQ(attn, static_cast<int>(frozen_pieces[static_cast<size_t>(w)].size()));
    }
    // Every id on every worker: held by its holders, frozen on the others.
    for (const auto& [id, p] : held_pieces) {
      std::vector<int> all = held_by.at(id);
      if (frozen_by.count(id))
        all.insert(all.end(), frozen_by.at(id).begin(), frozen_by.at(id).end());
      std::sort(all.begin(), all.end());
      std::vector<int> want(static_cast<size_t>(n));
      for (int w = 0; w < n; ++w) want[static_cast<size_t>(w)] = w;
      EXPECT_EQ(all, want) << "id " << id;
    }
  }
}

// The backward-masked attention with heads against finite differences (input and trained
// parameters), with RoPE and GQA (Llama) and biases (GPT-2), at a worker whose groups wrap when
// one does; the input's gradient flows through the frozen heads too (were it masked, the check
// would fail), and the frozen tensors get no gradient.
TEST(SdpBackwardHeadMasking, AttentionGradcheck) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    const ModelConfig c = heads_config(llama, 4);
    const NeuronAssignment mlp = cover_of(c, 4, 2, 3), heads = heads_of(c, 4, 2, 3);
    int w = 0;
    for (int v = 0; v < 4; ++v)
      if (heads.layers[0].owned_ranges(v).size() == 2) w = v;
    CausalSelfAttention attn(c, DType::kF64, {}, backward_context(mlp, heads, w), 0);
    Generator g(4);
    attn.init(g, 0.3, 0.3);
    loom::testing::perturb_parameters(attn, 0.1, 5);
    const auto frozen = frozen_parameters(attn);
    ASSERT_EQ(frozen.size(), llama ? 2u : 3u);
    {
      autograd::NoGradGuard no_grad;
      for (auto& [name, t] : frozen) {
        Tensor f = t;
        ops::add_(f, randn(t.shape(), g, DType::kF64, 0.0, 0.1));
      }
    }
    const Tensor x = loom::testing::random({1, 3, c.n_embd}, g);
    const Tensor pos = Transformer::host_positions(3);
    std::vector<Tensor> inputs = {x};
    for (const Tensor& p : attn.parameters()) inputs.push_back(p);
    EXPECT_EQ(inputs.size(), llama ? 3u : 5u);  // the frozen tensors are not parameters
    loom::testing::expect_gradcheck(
        [&](const std::vector<Tensor>& in) { return attn.forward(in[0], pos); }, inputs);
    for (auto& [name, t] : frozen) EXPECT_FALSE(t.grad().defined()) << name;
  }
}

TEST(SdpBackwardHeadMasking, FactoryErrorsAndDefaults) {
  const ModelConfig c = heads_config(true, 4);
  const NeuronAssignment mlp = cover_of(c, 4, 2, 1), heads = heads_of(c, 4, 2, 1);
  EXPECT_THROW(BackwardMaskingLinear(mlp, 0, heads_of(c, 2, 2, 1)), Error);
  EXPECT_THROW(BackwardMaskingLinear(mlp, 0, heads_of(c, 4, 3, 1)), Error);
  CoverOptions o{4, 0.5, 1};
  const NeuronAssignment five =
      assign_neurons(o, std::vector<int64_t>(static_cast<size_t>(c.n_layer), 5));
  try {
    Transformer(c, DType::kF64, {}, backward_masking_context(mlp, 0, five));
    ADD_FAILURE() << "no error for a heads cover of 5 groups over 4 kv heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_kv_head"), std::string::npos) << e.what();
  }
  // Without heads the factory builds the default attention; with, the full width split.
  const BackwardMaskingLinear plain(mlp, 0), split(mlp, 0, heads);
  EXPECT_EQ(plain.heads(), nullptr);
  ASSERT_NE(split.heads(), nullptr);
  const auto qkv = plain.attn_in(0, 32, {32, 16, 16}, false, DType::kF64, {});
  EXPECT_TRUE(qkv->plain());
  EXPECT_EQ(qkv->out_features(), 64);
  const auto split_qkv = split.attn_in(0, 32, {32, 16, 16}, false, DType::kF64, {});
  EXPECT_FALSE(split_qkv->plain());
  EXPECT_EQ(split_qkv->out_features(), 64);
  EXPECT_EQ(split_qkv->weight().size(0), 32);  // 2 of 4 groups: 16 q, 8 k and 8 v rows
  const auto split_proj = split.attn_out(0, 32, 32, false, DType::kF64, {});
  EXPECT_EQ(split_proj->in_features(), 32);
  EXPECT_EQ(split_proj->weight().size(1), 16);
}

}  // namespace
}  // namespace loom::parallel::sdp
