// tests/parallel/sdp/forward_masking_test.cpp — SDP forward masking at the neuron level
// (parallel/sdp/forward_masking.h) in one process, f64 tiny GPT-2 and Llama models, every worker of
// several (N, k, seed): the packed MLP weights are the owned rows/columns of the default model's
// after the same init (and everything else equal); the logits, loss and gradients equal those of
// a reference built independently from the default model (unowned rows of fc / gate / up and
// their biases zeroed, proj / down multiplied by N/k); the average of the workers' MLP outputs is
// the full MLP's; each packed weight's placement names exactly its owned elements (and the
// workers' pieces cover every element k times); the packed weights have ⌊kU/N⌋ or ⌈kU/N⌉ rows;
// coverage 1 is the default model bit for bit; the packed layers' backward against finite
// differences; the factory's errors.
#include "parallel/sdp/forward_masking.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/activation.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "core/tensor_piece.h"
#include "layers/mlp.h"
#include "layers/transformer.h"
#include "tests/gradcheck.h"
#include "tests/layers/tiny_models.h"
#include "tests/parallel/sdp/sdp_test_util.h"

namespace loom::parallel::sdp {
namespace {

using loom::testing::rel_error;
using namespace test_util;  // NOLINT(build/namespaces): the shared test helpers
using Case = NeuronCase;

// k ≥ 2 (a connected cover), windows that wrap and that do not, C from 1/4 to 3/4.
const std::vector<Case> kCases = {{2, 2, 1}, {3, 2, 7},  {4, 2, 3}, {5, 2, 5},
                                  {4, 3, 9}, {8, 2, 11}, {6, 3, 13}};

bool is_input_weight(const std::string& leaf) {  // packed along dim 0
  return leaf == "fc.weight" || leaf == "fc.bias" || leaf == "gate.weight" || leaf == "up.weight";
}
bool is_output_weight(const std::string& leaf) {  // packed along dim 1
  return leaf == "proj.weight" || leaf == "down.weight";
}

// What the packed parameter `name` of worker w holds of the full tensor `full`.
Tensor expected_part(const std::string& name, const Tensor& full, const NeuronAssignment& a,
                     int w) {
  std::string leaf;
  const int64_t l = mlp_param(name, &leaf);
  if (l < 0) return full;
  if (is_input_weight(leaf)) return units_of(full, 0, a.owned_units(w, static_cast<int>(l)));
  if (is_output_weight(leaf)) return units_of(full, 1, a.owned_units(w, static_cast<int>(l)));
  return full;  // proj.bias: whole
}

// Loads every parameter of `packed` from the same-named one of `full` through its placement's
// piece (so a wrong placement loads wrong values).
void load_through_pieces(const Module& packed, const Module& full) {
  const auto src = params_of(full);
  for (auto& [name, p] : packed.named_parameters()) load_through_piece(name, p, src);
}

// A copy of `full` as forward masking's worker w computes it (Note [SDP packed MLP]): the unowned
// units' input rows and biases zeroed, the output projection scaled by N/k.
void make_reference(const Module& ref, const NeuronAssignment& a, int w) {
  autograd::NoGradGuard no_grad;
  const double scale = static_cast<double>(a.workers) / a.replication;
  for (auto& [name, p] : ref.named_parameters()) {
    std::string leaf;
    const int64_t l = mlp_param(name, &leaf);
    if (l < 0) continue;
    const std::vector<int64_t> owned = a.owned_units(w, static_cast<int>(l));
    const std::set<int64_t> keep(owned.begin(), owned.end());
    double* d = p.data<double>();
    if (is_input_weight(leaf)) {
      const int64_t row = p.dim() == 2 ? p.size(1) : 1;
      for (int64_t u = 0; u < p.size(0); ++u) {
        if (keep.count(u) == 0)
          for (int64_t j = 0; j < row; ++j) d[u * row + j] = 0.0;
      }
    } else if (is_output_weight(leaf)) {
      for (int64_t i = 0; i < p.numel(); ++i) d[i] *= scale;
    }
  }
}

// Worker w's packed model after the default init is a part of the default model.
void expect_init_is_part(bool llama, const Case& cs) {
  const ModelConfig c = config(llama);
  const NeuronAssignment a = cover_of(c, cs.workers, cs.k, cs.seed);
  Transformer full(c, DType::kF64);
  Generator g0(cs.seed + 100);
  full.init_weights(g0);
  const auto fp = params_of(full);
  const int64_t U = c.ffn_hidden_size();
  for (int w = 0; w < cs.workers; ++w) {
    SCOPED_TRACE("worker " + std::to_string(w));
    Transformer m(c, DType::kF64, {}, forward_masking_context(a, w));
    Generator g(cs.seed + 100);
    m.init_weights(g);
    const auto mp = params_of(m);
    ASSERT_EQ(mp.size(), fp.size());
    int packed = 0;
    for (auto& [name, p] : mp) {
      const Tensor want = expected_part(name, fp.at(name), a, w);
      ASSERT_EQ(p.shape(), want.shape()) << name;
      EXPECT_EQ(p.to_vector(), want.to_vector()) << name;
      std::string leaf;
      const int64_t l = mlp_param(name, &leaf);
      if (l < 0 || !(is_input_weight(leaf) || is_output_weight(leaf))) continue;
      // The GEMMs shrink: ⌊kU/N⌋ or ⌈kU/N⌉ units, fewer than U below coverage 1.
      ++packed;
      const int64_t held = p.size(is_input_weight(leaf) ? 0 : 1);
      EXPECT_GE(held, cs.k * U / cs.workers) << name;
      EXPECT_LE(held, (cs.k * U + cs.workers - 1) / cs.workers) << name;
      if (cs.k < cs.workers) {
        EXPECT_LT(held, U) << name;
      }
    }
    // fc.weight, fc.bias, proj.weight (gpt2) or gate, up, down (llama) per block.
    EXPECT_EQ(packed, static_cast<int>(c.n_layer) * 3) << "packed MLP weights";
  }
}

TEST(SdpPackedLayers, InitKeepsTheDefaultModelsOwnedRowsAndColumnsGpt2) {
  for (const Case& cs : kCases) expect_init_is_part(false, cs);
  // The cases can tell the blocks apart: some worker holds other units in block 1 than in
  // block 0, so a factory given the wrong block index would fail above.
  bool differ = false;
  for (const Case& cs : kCases) {
    const NeuronAssignment a = cover_of(config(false), cs.workers, cs.k, cs.seed);
    for (int w = 0; w < cs.workers; ++w)
      differ = differ || a.owned_units(w, 0) != a.owned_units(w, 1);
  }
  EXPECT_TRUE(differ);
}

TEST(SdpPackedLayers, InitKeepsTheDefaultModelsOwnedRowsAndColumnsLlama) {
  for (const Case& cs : kCases) expect_init_is_part(true, cs);
}

// Forward and backward of every worker against the masked, scaled reference.
void expect_matches_reference(bool llama, const Case& cs) {
  const ModelConfig c = config(llama);
  const NeuronAssignment a = cover_of(c, cs.workers, cs.k, cs.seed);
  const double scale = static_cast<double>(cs.workers) / cs.k;
  Transformer full(c, DType::kF64);
  init_perturbed(full, cs.seed);
  const Tensor ids = loom::testing::random_ids(2, 6, c.vocab_size, cs.seed + 2);
  const Tensor targets = loom::testing::random_ids(2, 6, c.vocab_size, cs.seed + 3);
  for (int w = 0; w < cs.workers; ++w) {
    SCOPED_TRACE("worker " + std::to_string(w) + " of " + std::to_string(cs.workers) +
                 ", k = " + std::to_string(cs.k));
    Transformer m(c, DType::kF64, {}, forward_masking_context(a, w));
    load_through_pieces(m, full);
    Transformer ref(c, DType::kF64);
    copy_parameters(ref, full);
    make_reference(ref, a, w);

    EXPECT_LT(rel_error(m.forward(ids), ref.forward(ids)), 1e-12) << "logits";
    const Tensor loss = m.loss(ids, targets), ref_loss = ref.loss(ids, targets);
    EXPECT_NEAR(loss.item(), ref_loss.item(), 1e-12 * std::abs(ref_loss.item()));
    autograd::backward(loss);
    autograd::backward(ref_loss);
    const auto rp = params_of(ref);
    for (auto& [name, p] : m.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      Tensor want = expected_part(name, rp.at(name).grad(), a, w);
      std::string leaf;
      // dL/dW_packed = (N/k)·dL/dW_ref for the scaled output projection (W_ref = (N/k)·W).
      if (mlp_param(name, &leaf) >= 0 && is_output_weight(leaf)) want = ops::scale(want, scale);
      EXPECT_LT(rel_error(p.grad(), want), 1e-12) << name;
    }
  }
}

TEST(SdpPackedLayers, ForwardAndGradientsMatchTheMaskedScaledReferenceGpt2) {
  for (const Case& cs : kCases) expect_matches_reference(false, cs);
}

TEST(SdpPackedLayers, ForwardAndGradientsMatchTheMaskedScaledReferenceLlama) {
  for (const Case& cs : kCases) expect_matches_reference(true, cs);
}

// Coverage 1: every worker's model is the default model, bit for bit.
void expect_coverage_one_is_default(bool llama, int workers) {
  const ModelConfig c = config(llama);
  const NeuronAssignment a = cover_of(c, workers, workers, 5);
  const FullRun full(c, 21, 5, 22);
  for (int w = 0; w < workers; ++w) {
    Transformer m(c, DType::kF64, {}, forward_masking_context(a, w));
    Generator g(21);
    m.init_weights(g);
    expect_is_full_model(m, full);
  }
}

TEST(SdpPackedLayers, CoverageOneIsTheDefaultModel) {
  for (bool llama : {false, true}) {
    expect_coverage_one_is_default(llama, 1);
    expect_coverage_one_is_default(llama, 4);
  }
}

// Decision 2 of docs/parallel.md: the average over the N workers of their MLP outputs is the
// full MLP's output, for any input (each unit held by k workers, scaled by N/k).
TEST(SdpPackedLayers, WorkersAverageToTheFullMlp) {
  for (bool llama : {false, true}) {
    const ModelConfig c = config(llama);
    for (const Case& cs : kCases) {
      const NeuronAssignment a = cover_of(c, cs.workers, cs.k, cs.seed);
      const int64_t layer = c.n_layer - 1, d = c.n_embd, U = c.ffn_hidden_size();
      std::unique_ptr<FeedForward> full;
      if (llama) {
        full = std::make_unique<SwiGluMlp>(d, U, false, DType::kF64);
      } else {
        full = std::make_unique<Mlp>(d, U, true, DType::kF64);
      }
      Generator g(cs.seed);
      full->init(g, 0.3, 0.2);
      loom::testing::perturb_parameters(*full, 0.1, cs.seed + 1);
      Generator gx(cs.seed + 2);
      const Tensor x = randn({2, 3, d}, gx, DType::kF64);
      Tensor sum;
      for (int w = 0; w < cs.workers; ++w) {
        const LayerContext ctx = forward_masking_context(a, w);
        std::unique_ptr<FeedForward> part;
        if (llama) {
          part = std::make_unique<SwiGluMlp>(d, U, false, DType::kF64, Device{}, ctx, layer);
        } else {
          part = std::make_unique<Mlp>(d, U, true, DType::kF64, Device{}, ctx, layer);
        }
        load_through_pieces(*part, *full);
        const Tensor y = part->forward(x);
        sum = sum.defined() ? ops::add(sum, y) : y;
      }
      EXPECT_LT(rel_error(ops::scale(sum, 1.0 / cs.workers), full->forward(x)), 1e-12)
          << (llama ? "llama" : "gpt2") << " N " << cs.workers << " k " << cs.k;
    }
  }
}

// Each packed weight's piece names exactly its owned elements; over the workers every element
// of a packed tensor is held k times.
TEST(SdpPackedLayers, PlacementsNameTheOwnedElements) {
  for (bool llama : {false, true}) {
    const ModelConfig c = config(llama);
    for (const Case& cs : kCases) {
      const NeuronAssignment a = cover_of(c, cs.workers, cs.k, cs.seed);
      std::map<std::string, std::vector<int>> held;  // per packed tensor, per global element
      for (int w = 0; w < cs.workers; ++w) {
        Transformer m(c, DType::kF64, {}, forward_masking_context(a, w));
        for (auto& [name, p] : m.named_parameters()) {
          std::string leaf;
          const int64_t l = mlp_param(name, &leaf);
          const TensorPiece piece = piece_of(p.placement(), p.shape());
          if (l < 0 || !(is_input_weight(leaf) || is_output_weight(leaf))) {
            EXPECT_EQ(piece, whole_piece(p.shape())) << name;
            continue;
          }
          const int64_t dim = is_input_weight(leaf) ? 0 : 1;
          // Mark the piece's elements with 1 in a global tensor of 0s, through the piece.
          const Tensor ones = Tensor::ones(p.shape(), DType::kF64);
          Tensor global = Tensor::zeros(piece.global_shape, DType::kF64);
          EXPECT_EQ(copy_overlap(piece, ones.raw_data(), whole_piece(piece.global_shape),
                                 global.raw_data(), 8),
                    p.numel())
              << name;
          const std::vector<int64_t> owned = a.owned_units(w, static_cast<int>(l));
          const std::set<int64_t> keep(owned.begin(), owned.end());
          const std::vector<double> g = global.to_vector();
          auto& count = held[name];
          count.resize(g.size(), 0);
          const int64_t cols = global.dim() == 2 ? global.size(1) : 1;
          for (int64_t i = 0; i < static_cast<int64_t>(g.size()); ++i) {
            const int64_t unit = dim == 0 ? i / cols : i % cols;
            EXPECT_EQ(g[i], keep.count(unit) ? 1.0 : 0.0) << name << " element " << i;
            count[static_cast<size_t>(i)] += static_cast<int>(g[i]);
          }
          EXPECT_EQ(p.placement().split_over(kAxisSdp)->dim, dim) << name;
        }
      }
      for (auto& [name, count] : held) {
        for (int n : count) ASSERT_EQ(n, cs.k) << name;
      }
    }
  }
}

// The packed layers' backward (input and parameters) against finite differences, with a
// window that wraps (two ranges) and a scale ≠ 1.
TEST(SdpPackedLayers, PackedMlpGradcheck) {
  const UnitRanges ranges = {{0, 3}, {7, 10}};
  Generator g(4);
  for (bool bias : {false, true}) {
    PackedColumnLinear fc(5, 10, ranges, bias, DType::kF64);
    PackedRowLinear proj(10, 4, ranges, bias, 2.5, DType::kF64);
    fc.init(g, 0.5);
    proj.init(g, 0.5);
    loom::testing::perturb_parameters(fc, 0.1, 5);
    loom::testing::perturb_parameters(proj, 0.1, 6);
    const Tensor x = loom::testing::random({2, 3, 5}, g);
    std::vector<Tensor> inputs = {x};
    for (const Tensor& p : fc.parameters()) inputs.push_back(p);
    for (const Tensor& p : proj.parameters()) inputs.push_back(p);
    loom::testing::expect_gradcheck(
        [&](const std::vector<Tensor>& in) { return proj.forward(ops::gelu(fc.forward(in[0]))); },
        inputs);
  }
}

TEST(SdpPackedLayers, FactoryErrorsNameTheBlockAndSizes) {
  const ModelConfig c = loom::testing::tiny_gpt2();
  const NeuronAssignment a = cover_of(c, 4, 2, 1);
  const ForwardMaskingLinear f(a, 1);
  EXPECT_EQ(f.scale(), 2.0);
  expect_mlp_size_errors(f, c);
  EXPECT_THROW(ForwardMaskingLinear(a, 4), Error);
  EXPECT_THROW(PackedColumnLinear(4, 10, {{3, 5}, {4, 8}}, true), Error);  // overlapping
  // A model with more blocks than the cover's layers.
  ModelConfig deeper = c;
  deeper.n_layer = c.n_layer + 1;
  EXPECT_THROW(Transformer(deeper, DType::kF64, {}, forward_masking_context(a, 0)), Error);
}

}  // namespace
}  // namespace loom::parallel::sdp
