// tests/parallel/sdp/backward_masking_test.cpp — SDP backward masking at the neuron level
// (parallel/sdp/backward_masking.h, Note [SDP backward masking layers]) in one process, f64 tiny
// GPT-2 and Llama models, every worker of several (N, k, seed) at coverage 1/2 and 1/4: after the
// same init the owned parameters and the frozen tensors are the default model's owned and
// unowned rows / columns and reassemble it exactly through their placements; with the pieces of
// one full model loaded, the worker's logits and loss equal the full model's, the owned
// gradients are the full gradients' owned rows / columns (packed shape), every other parameter's
// gradient is the full one and the frozen tensors get none; frozen_parameters names every frozen
// tensor by its global name with the unowned runs; coverage 1 is the default model bit for bit;
// the owned placements are forward masking's; zero_rows_from; the layers' backward against finite
// differences; the factory's errors.
#include "parallel/sdp/backward_masking.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/activation.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/view.h"
#include "core/tensor_piece.h"
#include "layers/mlp.h"
#include "layers/transformer.h"
#include "parallel/sdp/forward_masking.h"
#include "tests/gradcheck.h"
#include "tests/layers/tiny_models.h"
#include "tests/parallel/sdp/sdp_test_util.h"

namespace loom::parallel::sdp {
namespace {

using loom::testing::rel_error;
using namespace test_util;  // NOLINT(build/namespaces): the shared test helpers
using Case = NeuronCase;

// Coverage 1/2 (N = 4 and 8) and 1/4 (N = 8), and one odd N; windows that wrap and that do not.
const std::vector<Case> kCases = {{4, 2, 3}, {8, 4, 5}, {8, 2, 11}, {5, 2, 7}};

// The dim of a split MLP parameter indexed by hidden units, or -1 (proj.bias and the rest).
int64_t unit_dim(const std::string& name, int64_t* layer) {
  std::string leaf;
  *layer = mlp_param(name, &leaf);
  if (*layer < 0) return -1;
  if (leaf == "fc.weight" || leaf == "fc.bias" || leaf == "gate.weight" || leaf == "up.weight")
    return 0;
  if (leaf == "proj.weight" || leaf == "down.weight") return 1;
  return -1;
}

// The units of [0, U) worker w does not hold in `layer`, ascending (the test's own complement).
std::vector<int64_t> unowned_units(const NeuronAssignment& a, int w, int64_t layer) {
  const std::vector<int64_t> owned = a.owned_units(w, static_cast<int>(layer));
  const std::set<int64_t> keep(owned.begin(), owned.end());
  std::vector<int64_t> out;
  for (int64_t u = 0; u < a.layers[static_cast<size_t>(layer)].units; ++u) {
    if (keep.count(u) == 0) out.push_back(u);
  }
  return out;
}

// What worker w's parameter `name` (owned) or frozen tensor (frozen) holds of `full`.
Tensor expected_part(const std::string& name, const Tensor& full, const NeuronAssignment& a, int w,
                     bool frozen) {
  int64_t l = -1;
  const int64_t dim = unit_dim(name, &l);
  if (dim < 0) return full;
  return units_of(full, dim,
                  frozen ? unowned_units(a, w, l) : a.owned_units(w, static_cast<int>(l)));
}

// Copies the elements `t` holds, through its placement's piece, into `global` (whose shape the
// placement must name), and adds 1 for each to `count`; returns the elements written.
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

// Loads every parameter and frozen tensor of `m` from the same-named tensor of `full` through its
// placement's piece (a wrong placement loads wrong values).
void load_through_pieces(const Module& m, const Module& full) {
  const auto src = params_of(full);
  for (auto& [name, p] : m.named_parameters()) load_through_piece(name, p, src);
  for (auto& [name, t] : frozen_parameters(m)) load_through_piece(name, t, src);
}

// After the same init, worker w's owned parameters and frozen tensors are the default model's
// owned and unowned parts, and together (placed by their placements) every element exactly once.
void expect_init_splits_the_default_model(bool llama, const Case& cs) {
  const ModelConfig c = config(llama);
  const NeuronAssignment a = cover_of(c, cs.workers, cs.k, cs.seed);
  Transformer full(c, DType::kF64);
  Generator g0(cs.seed + 100);
  full.init_weights(g0);
  const auto fp = params_of(full);
  const int64_t U = c.ffn_hidden_size();
  for (int w = 0; w < cs.workers; ++w) {
    SCOPED_TRACE("worker " + std::to_string(w) + " of " + std::to_string(cs.workers) +
                 ", k = " + std::to_string(cs.k));
    Transformer m(c, DType::kF64, {}, backward_masking_context(a, w));
    Generator g(cs.seed + 100);
    m.init_weights(g);
    const auto mp = params_of(m);
    ASSERT_EQ(mp.size(), fp.size());
    std::map<std::string, Tensor> frozen;
    for (auto& [name, t] : frozen_parameters(m)) {
      EXPECT_EQ(frozen.count(name), 0u) << name << " listed twice";
      frozen[name] = t;
    }
    int split = 0;
    for (auto& [name, p] : mp) {
      ASSERT_EQ(fp.count(name), 1u) << name;
      const Tensor& f = fp.at(name);
      const Tensor want = expected_part(name, f, a, w, false);
      ASSERT_EQ(p.shape(), want.shape()) << name;
      EXPECT_EQ(p.to_vector(), want.to_vector()) << name;
      int64_t l = -1;
      const int64_t dim = unit_dim(name, &l);
      Tensor global = Tensor::zeros(f.shape(), DType::kF64);
      Tensor count = Tensor::zeros(f.shape(), DType::kF64);
      EXPECT_EQ(place_into(p, global, count), p.numel()) << name;
      if (dim < 0) {
        EXPECT_EQ(frozen.count(name), 0u) << name << " is not split";
        continue;
      }
      ++split;
      const int64_t held = p.size(dim);
      EXPECT_GE(held, cs.k * U / cs.workers) << name;
      EXPECT_LE(held, (cs.k * U + cs.workers - 1) / cs.workers) << name;
      ASSERT_EQ(frozen.count(name), 1u) << name << " has no frozen part";
      const Tensor& fz = frozen.at(name);
      const Tensor want_frozen = expected_part(name, f, a, w, true);
      ASSERT_EQ(fz.shape(), want_frozen.shape()) << name;
      EXPECT_EQ(fz.to_vector(), want_frozen.to_vector()) << name;
      EXPECT_EQ(held + fz.size(dim), U) << name;
      EXPECT_EQ(place_into(fz, global, count), fz.numel()) << name;
      // Owned ∪ frozen is the default model's tensor, each element placed once.
      EXPECT_EQ(global.to_vector(), f.to_vector()) << name;
      EXPECT_EQ(count.to_vector(), std::vector<double>(static_cast<size_t>(f.numel()), 1.0))
          << name;
    }
    // fc.weight, fc.bias, proj.weight (gpt2) or gate, up, down (llama) per block.
    EXPECT_EQ(split, static_cast<int>(c.n_layer) * 3);
    EXPECT_EQ(frozen.size(), static_cast<size_t>(split));
  }
}

TEST(SdpBackwardMasking, InitSplitsTheDefaultModelGpt2) {
  for (const Case& cs : kCases) expect_init_splits_the_default_model(false, cs);
}

TEST(SdpBackwardMasking, InitSplitsTheDefaultModelLlama) {
  for (const Case& cs : kCases) expect_init_splits_the_default_model(true, cs);
}

// frozen_parameters: the global names of the split tensors in named_parameters' order, each the
// layer's frozen tensor, requiring no grad, placed over sdp at the unit dim with one run per
// unowned range (local ascending from 0, global the unowned units) and the full global shape.
TEST(SdpBackwardMasking, FrozenParametersNamesAndPlacements) {
  for (bool llama : {false, true}) {
    const ModelConfig c = config(llama);
    for (const Case& cs : kCases) {
      const NeuronAssignment a = cover_of(c, cs.workers, cs.k, cs.seed);
      for (int w = 0; w < cs.workers; ++w) {
        Transformer full(c, DType::kF64);
        Transformer m(c, DType::kF64, {}, backward_masking_context(a, w));
        const auto fp = params_of(full);
        std::vector<std::string> want_names;
        for (auto& [name, p] : m.named_parameters()) {
          int64_t l = -1;
          if (unit_dim(name, &l) >= 0) want_names.push_back(name);
        }
        const auto frozen = frozen_parameters(m);
        std::vector<std::string> names;
        for (auto& [name, t] : frozen) names.push_back(name);
        EXPECT_EQ(names, want_names);
        for (auto& [name, t] : frozen) {
          SCOPED_TRACE(name + ", worker " + std::to_string(w));
          int64_t l = -1;
          const int64_t dim = unit_dim(name, &l);
          EXPECT_FALSE(t.requires_grad());
          EXPECT_TRUE(t.is_leaf());
          ASSERT_TRUE(t.has_placement());
          const Placement pl = t.placement();
          EXPECT_EQ(pl.global_shape, fp.at(name).shape());
          ASSERT_EQ(pl.splits.size(), 1u);
          const PlacementSplit* split = pl.split_over(kAxisSdp);
          ASSERT_NE(split, nullptr);
          EXPECT_EQ(split->dim, dim);
          // Runs: the maximal ranges of the unowned units, in order, packed from local 0.
          const std::vector<int64_t> units = unowned_units(a, w, l);
          std::vector<PlacementRun> want;
          for (size_t i = 0; i < units.size(); ++i) {
            if (i > 0 && units[i] == units[i - 1] + 1) {
              ++want.back().length;
            } else {
              want.push_back({static_cast<int64_t>(i), units[i], 1});
            }
          }
          EXPECT_EQ(split->runs, want);
          EXPECT_LE(want.size(), 2u);
        }
      }
    }
  }
}

// The factory's record names the same tensors as the model walk, per model: two models built
// from one factory each get their own, and a destroyed model's layers are skipped.
TEST(SdpBackwardMasking, FrozenParametersFromTheFactory) {
  for (bool llama : {false, true}) {
    const ModelConfig c = config(llama);
    const NeuronAssignment a = cover_of(c, 8, 2, 11);
    auto f = std::make_shared<const BackwardMaskingLinear>(a, 3);
    LayerContext ctx;
    ctx.linear = f;
    auto first = std::make_unique<Transformer>(c, DType::kF64, Device{}, ctx);
    const Transformer second(c, DType::kF64, Device{}, ctx);
    for (const Module* m : std::vector<const Module*>{first.get(), &second}) {
      const auto walked = frozen_parameters(*m);
      const auto recorded = frozen_parameters(*f, m->named_parameters());
      ASSERT_EQ(walked.size(), static_cast<size_t>(c.n_layer) * 3);
      ASSERT_EQ(recorded.size(), walked.size());
      for (size_t i = 0; i < walked.size(); ++i) {
        EXPECT_EQ(recorded[i].first, walked[i].first);
        EXPECT_TRUE(recorded[i].second.same(walked[i].second)) << walked[i].first;
      }
    }
    // The two models' frozen tensors are distinct.
    const auto a1 = frozen_parameters(*first), a2 = frozen_parameters(second);
    for (size_t i = 0; i < a1.size(); ++i) EXPECT_FALSE(a1[i].second.same(a2[i].second));
    first.reset();
    EXPECT_EQ(f->built_pairs().size(), static_cast<size_t>(c.n_layer) * 3);  // only `second`'s
    EXPECT_EQ(frozen_parameters(*f, second.named_parameters()).size(), a2.size());
  }
}

// Forward and backward of every worker against the full model whose pieces it was loaded with.
void expect_matches_full_model(bool llama, const Case& cs) {
  const ModelConfig c = config(llama);
  const NeuronAssignment a = cover_of(c, cs.workers, cs.k, cs.seed);
  Transformer full(c, DType::kF64);
  init_perturbed(full, cs.seed);
  const Tensor ids = loom::testing::random_ids(2, 6, c.vocab_size, cs.seed + 2);
  const Tensor targets = loom::testing::random_ids(2, 6, c.vocab_size, cs.seed + 3);
  const Tensor full_logits = full.forward(ids);
  const Tensor full_loss = full.loss(ids, targets);
  autograd::backward(full_loss);
  const auto fp = params_of(full);
  const int64_t U = c.ffn_hidden_size();
  for (int w = 0; w < cs.workers; ++w) {
    SCOPED_TRACE("worker " + std::to_string(w) + " of " + std::to_string(cs.workers) +
                 ", k = " + std::to_string(cs.k));
    Transformer m(c, DType::kF64, {}, backward_masking_context(a, w));
    load_through_pieces(m, full);
    EXPECT_LT(rel_error(m.forward(ids), full_logits), 1e-12) << "logits";
    const Tensor loss = m.loss(ids, targets);
    EXPECT_NEAR(loss.item(), full_loss.item(), 1e-12 * std::abs(full_loss.item()));
    autograd::backward(loss);
    for (auto& [name, p] : m.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      const Tensor want = expected_part(name, fp.at(name).grad(), a, w, false);
      // The owned gradient has the packed shape: no full-size dW was formed and masked.
      ASSERT_EQ(p.grad().shape(), p.shape()) << name;
      ASSERT_EQ(p.grad().shape(), want.shape()) << name;
      EXPECT_LT(rel_error(p.grad(), want), 1e-12) << name;
      int64_t l = -1;
      const int64_t dim = unit_dim(name, &l);
      if (dim >= 0) {
        EXPECT_LT(p.size(dim), U) << name;
      }
    }
    // The unowned dW GEMMs are skipped: the frozen tensors get no gradient.
    const auto frozen = frozen_parameters(m);
    EXPECT_EQ(frozen.size(), static_cast<size_t>(c.n_layer) * 3);
    for (auto& [name, t] : frozen) {
      EXPECT_FALSE(t.requires_grad()) << name;
      EXPECT_FALSE(t.grad().defined()) << name;
    }
  }
}

TEST(SdpBackwardMasking, ForwardAndGradientsMatchTheFullModelGpt2) {
  for (const Case& cs : kCases) expect_matches_full_model(false, cs);
}

TEST(SdpBackwardMasking, ForwardAndGradientsMatchTheFullModelLlama) {
  for (const Case& cs : kCases) expect_matches_full_model(true, cs);
}

// Note [Compute dtype]: with f64 masters computing in f32 both parts are cast; the worker still
// matches the full model computing in f32 (to f32 rounding: its GEMMs are split), the owned
// gradients reach the masters in f64 and the frozen tensors get none.
TEST(SdpBackwardMasking, ComputeDtypeCastsBothParts) {
  for (bool llama : {false, true}) {
    const ModelConfig c = config(llama);
    const NeuronAssignment a = cover_of(c, 4, 2, 3);
    Transformer full(c, DType::kF64);
    init_perturbed(full, 31);
    full.set_compute_dtype(DType::kF32);
    const Tensor ids = loom::testing::random_ids(2, 6, c.vocab_size, 33);
    const Tensor targets = loom::testing::random_ids(2, 6, c.vocab_size, 34);
    const Tensor full_loss = full.loss(ids, targets);
    autograd::backward(full_loss);
    const auto fp = params_of(full);
    Transformer m(c, DType::kF64, {}, backward_masking_context(a, 1));
    load_through_pieces(m, full);
    m.set_compute_dtype(DType::kF32);
    const Tensor logits = m.forward(ids);
    EXPECT_EQ(logits.dtype(), DType::kF32);
    EXPECT_LT(rel_error(logits, full.forward(ids)), 1e-5);
    const Tensor loss = m.loss(ids, targets);
    EXPECT_NEAR(loss.item(), full_loss.item(), 1e-5 * std::abs(full_loss.item()));
    autograd::backward(loss);
    for (auto& [name, p] : m.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(p.grad().dtype(), DType::kF64) << name;
      EXPECT_LT(rel_error(p.grad(), expected_part(name, fp.at(name).grad(), a, 1, false)), 1e-4)
          << name;
    }
    for (auto& [name, t] : frozen_parameters(m)) EXPECT_FALSE(t.grad().defined()) << name;
  }
}

// Coverage 1: every worker's model is the default model, bit for bit, with nothing frozen.
void expect_coverage_one_is_default(bool llama, int workers) {
  const ModelConfig c = config(llama);
  const NeuronAssignment a = cover_of(c, workers, workers, 5);
  const FullRun full(c, 21, 5, 22);
  for (int w = 0; w < workers; ++w) {
    Transformer m(c, DType::kF64, {}, backward_masking_context(a, w));
    Generator g(21);
    m.init_weights(g);
    EXPECT_TRUE(frozen_parameters(m).empty());
    bool all_plain = true;
    int masked = 0;
    m.for_each_module([&](const Module& mod) {
      if (const auto* l = dynamic_cast<const BackwardMaskedLinear*>(&mod)) {
        ++masked;
        all_plain = all_plain && l->plain() && l->unowned_ranges().empty();
      }
    });
    EXPECT_EQ(masked, static_cast<int>(c.n_layer) * (llama ? 3 : 2));
    EXPECT_TRUE(all_plain);
    expect_is_full_model(m, full);
  }
}

TEST(SdpBackwardMasking, CoverageOneIsTheDefaultModel) {
  for (bool llama : {false, true}) {
    expect_coverage_one_is_default(llama, 1);
    expect_coverage_one_is_default(llama, 4);
  }
}

// The split layers' backward (input and owned parameters) against finite differences, owning
// two ranges (the frozen part between them) and one range (frozen parts on both sides). The
// input's gradient flows through the frozen units too: were it masked, the check would fail.
TEST(SdpBackwardMasking, SplitMlpGradcheck) {
  Generator g(4);
  for (const UnitRanges& owned : {UnitRanges{{0, 3}, {7, 10}}, UnitRanges{{2, 6}}}) {
    for (bool bias : {false, true}) {
      BackwardMaskedColumnLinear fc(5, 10, owned, bias, DType::kF64);
      BackwardMaskedRowLinear proj(10, 4, owned, bias, DType::kF64);
      fc.init(g, 0.5);
      proj.init(g, 0.5);
      loom::testing::perturb_parameters(fc, 0.1, 5);
      loom::testing::perturb_parameters(proj, 0.1, 6);
      {
        autograd::NoGradGuard no_grad;
        Tensor fb = fc.frozen_bias();
        if (fb.defined()) ops::add_(fb, randn(fb.shape(), g, DType::kF64, 0.0, 0.1));
      }
      EXPECT_FALSE(fc.plain());
      EXPECT_FALSE(proj.plain());
      const Tensor x = loom::testing::random({2, 3, 5}, g);
      std::vector<Tensor> inputs = {x};
      for (const Tensor& p : fc.parameters()) inputs.push_back(p);
      for (const Tensor& p : proj.parameters()) inputs.push_back(p);
      EXPECT_EQ(inputs.size(), bias ? 5u : 3u);  // the frozen tensors are not parameters
      loom::testing::expect_gradcheck(
          [&](const std::vector<Tensor>& in) { return proj.forward(ops::gelu(fc.forward(in[0]))); },
          inputs);
      EXPECT_FALSE(fc.frozen_weight().grad().defined());
      EXPECT_FALSE(proj.frozen_weight().grad().defined());
    }
  }
}

// One split MLP equals the plain layers holding the reassembled weights, for any input: the
// column layer's output is the full layer's units permuted (owned first), the row layer's the
// full output.
TEST(SdpBackwardMasking, SplitLayersAreThePermutedFullLayers) {
  Generator g(8);
  const UnitRanges owned = {{0, 2}, {6, 9}};
  const std::vector<int64_t> order = {0, 1, 6, 7, 8, 2, 3, 4, 5};  // owned first, then frozen
  BackwardMaskedColumnLinear fc(4, 9, owned, true, DType::kF64);
  BackwardMaskedRowLinear proj(9, 3, owned, true, DType::kF64);
  fc.init(g, 0.5);
  proj.init(g, 0.5);
  loom::testing::perturb_parameters(fc, 0.1, 9);
  loom::testing::perturb_parameters(proj, 0.1, 10);
  {
    autograd::NoGradGuard no_grad;
    Tensor fb = fc.frozen_bias();
    ops::add_(fb, randn(fb.shape(), g, DType::kF64, 0.0, 0.1));
  }
  // The full weights, reassembled by the test from the ranges.
  Tensor w_fc = Tensor::zeros({9, 4}, DType::kF64), b_fc = Tensor::zeros({9}, DType::kF64);
  Tensor w_proj = Tensor::zeros({3, 9}, DType::kF64);
  {
    const std::vector<double> wo = fc.weight().to_vector(), wu = fc.frozen_weight().to_vector();
    const std::vector<double> bo = fc.bias().to_vector(), bu = fc.frozen_bias().to_vector();
    const std::vector<double> po = proj.weight().to_vector(), pu = proj.frozen_weight().to_vector();
    double *wf = w_fc.data<double>(), *bf = b_fc.data<double>(), *pf = w_proj.data<double>();
    for (size_t i = 0; i < order.size(); ++i) {
      const int64_t u = order[i];
      const bool is_owned = i < 5;
      const size_t j = is_owned ? i : i - 5;
      for (int c = 0; c < 4; ++c) wf[u * 4 + c] = (is_owned ? wo : wu)[j * 4 + c];
      bf[u] = (is_owned ? bo : bu)[j];
      for (int r = 0; r < 3; ++r) pf[r * 9 + u] = (is_owned ? po : pu)[r * (is_owned ? 5 : 4) + j];
    }
  }
  Generator gx(11);
  const Tensor x = randn({2, 3, 4}, gx, DType::kF64);
  const Tensor hidden = fc.forward(x);
  const Tensor full_hidden = ops::linear(x, w_fc, b_fc);
  Tensor permuted = units_of(full_hidden, 2, order);
  EXPECT_LT(rel_error(hidden, permuted), 1e-14);
  const Tensor y = proj.forward(ops::gelu(hidden));
  const Tensor full_y = ops::linear(ops::gelu(full_hidden), w_proj, proj.bias());
  EXPECT_LT(rel_error(y, full_y), 1e-13);
}

// The owned parameters carry forward masking's placements exactly (so the sync and checkpoints
// treat them alike), and the row layer's bias none.
TEST(SdpBackwardMasking, OwnedPlacementsAreForwardMaskings) {
  for (const UnitRanges& owned : {UnitRanges{{0, 3}, {7, 10}}, UnitRanges{{2, 6}}}) {
    const BackwardMaskedColumnLinear fc(5, 10, owned, true, DType::kF64);
    const PackedColumnLinear packed_fc(5, 10, owned, true, DType::kF64);
    const BackwardMaskedRowLinear proj(10, 4, owned, true, DType::kF64);
    const PackedRowLinear packed_proj(10, 4, owned, true, 2.0, DType::kF64);
    EXPECT_EQ(fc.weight().placement(), packed_fc.weight().placement());
    EXPECT_EQ(fc.bias().placement(), packed_fc.bias().placement());
    EXPECT_EQ(proj.weight().placement(), packed_proj.weight().placement());
    EXPECT_FALSE(proj.bias().has_placement());
    EXPECT_FALSE(proj.frozen_bias().defined());
    std::vector<std::string> names;
    for (auto& [name, p] : fc.named_parameters()) names.push_back(name);
    for (auto& [name, p] : proj.named_parameters()) names.push_back(name);
    EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias", "weight", "bias"}));
  }
}

// zero_rows_from zeroes the global rows from the given one in both parts.
TEST(SdpBackwardMasking, ZeroRowsFromCoversBothParts) {
  Generator g(12);
  BackwardMaskedColumnLinear fc(3, 9, {{0, 2}, {6, 9}}, false, DType::kF64);
  fc.init(g, 1.0);
  fc.zero_rows_from(5);  // owned units 0 1 6 7 8, frozen 2 3 4 5
  const std::vector<double> wo = fc.weight().to_vector(), wu = fc.frozen_weight().to_vector();
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(wo[r * 3 + c] == 0.0, r >= 2) << "owned row " << r;
  }
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(wu[r * 3 + c] == 0.0, r >= 3) << "frozen row " << r;
  }
  BackwardMaskedRowLinear proj(9, 3, {{0, 2}, {6, 9}}, false, DType::kF64);
  proj.init(g, 1.0);
  proj.zero_rows_from(1);
  const std::vector<double> po = proj.weight().to_vector(), pu = proj.frozen_weight().to_vector();
  for (size_t i = 0; i < po.size(); ++i) EXPECT_EQ(po[i] == 0.0, i >= 5) << "owned " << i;
  for (size_t i = 0; i < pu.size(); ++i) EXPECT_EQ(pu[i] == 0.0, i >= 4) << "frozen " << i;
}

TEST(SdpBackwardMasking, FactoryErrorsNameTheBlockAndSizes) {
  const ModelConfig c = loom::testing::tiny_gpt2();
  const NeuronAssignment a = cover_of(c, 4, 2, 1);
  const BackwardMaskingLinear f(a, 1);
  expect_mlp_size_errors(f, c);
  EXPECT_THROW(BackwardMaskingLinear(a, 4), Error);
  EXPECT_THROW(BackwardMaskingLinear(a, -1), Error);
  EXPECT_THROW(BackwardMaskedColumnLinear(4, 10, {{3, 5}, {4, 8}}, true), Error);  // overlapping
  EXPECT_THROW(BackwardMaskedRowLinear(10, 4, {}, true), Error);                   // nothing owned
  ModelConfig deeper = c;
  deeper.n_layer = c.n_layer + 1;
  EXPECT_THROW(Transformer(deeper, DType::kF64, {}, backward_masking_context(a, 0)), Error);
  // A model built by the forward-masking factory has no frozen tensors.
  const Transformer fwd(c, DType::kF64, {}, forward_masking_context(a, 0));
  EXPECT_TRUE(frozen_parameters(fwd).empty());
}

}  // namespace
}  // namespace loom::parallel::sdp
