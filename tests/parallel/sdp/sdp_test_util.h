// tests/parallel/sdp/sdp_test_util.h — helpers shared by the SDP tests (tests/parallel/sdp/):
// the tiny models and their neuron covers, parameters by name, the test's own parse and gather
// of MLP units, loading a tensor through its placement's piece; and, for the MPI tests of
// SliceSync and SlicePublisher, a layout of slices (row or column blocks of a few matrices) with
// holder sets of every kind. Each is the test's own computation, independent of the code under
// test beyond the API it calls.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/view.h"
#include "core/tensor.h"
#include "core/tensor_piece.h"
#include "layers/build_context.h"
#include "layers/transformer.h"
#include "parallel/sdp/assignment.h"
#include "tests/layers/tiny_models.h"

namespace loom::parallel::sdp::test_util {

// One neuron-level case: N workers, each unit held by k of them, the cover's seed.
struct NeuronCase {
  int workers;
  int k;
  uint64_t seed;
};

// The tiny f64 Llama or GPT-2 of tests/layers/tiny_models.h.
inline ModelConfig config(bool llama) {
  return llama ? loom::testing::tiny_llama() : loom::testing::tiny_gpt2();
}

// A neuron cover of c's MLPs: `workers` workers, k of them per unit, from `seed`.
inline NeuronAssignment cover_of(const ModelConfig& c, int workers, int k, uint64_t seed) {
  CoverOptions o;
  o.workers = workers;
  o.coverage = static_cast<double>(k) / workers;
  o.seed = seed;
  return assign_neurons(o,
                        std::vector<int64_t>(static_cast<size_t>(c.n_layer), c.ffn_hidden_size()));
}

inline std::map<std::string, Tensor> params_of(const Module& m) {
  std::map<std::string, Tensor> out;
  for (auto& [name, p] : m.named_parameters()) out[name] = p;
  return out;
}

// dst's parameters ← src's of the same name (dst may hold fewer).
inline void copy_parameters(const Module& dst, const Module& src) {
  autograd::NoGradGuard no_grad;
  const auto s = params_of(src);
  for (auto& [name, p] : dst.named_parameters()) {
    Tensor t = p;
    ops::copy_(t, s.at(name));
  }
}

// m's parameters from Generator(seed), then perturbed (seed + 1) so that biases and norms are not
// 0 / 1.
inline void init_perturbed(Transformer& m, uint64_t seed) {
  Generator g(seed);
  m.init_weights(g);
  loom::testing::perturb_parameters(m, 0.05, seed + 1);
}

// The default f64 model of c, its parameters from Generator(init_seed), with its loss on random
// (2, t) ids and targets (seeds data_seed and data_seed + 1) and that loss's backward run.
struct FullRun {
  FullRun(const ModelConfig& c, uint64_t init_seed, int64_t t, uint64_t data_seed)
      : model(c, DType::kF64) {
    Generator g(init_seed);
    model.init_weights(g);
    ids = loom::testing::random_ids(2, t, c.vocab_size, data_seed);
    targets = loom::testing::random_ids(2, t, c.vocab_size, data_seed + 1);
    loss = model.loss(ids, targets);
    autograd::backward(loss);
    params = params_of(model);
  }
  Transformer model;
  Tensor ids, targets, loss;
  std::map<std::string, Tensor> params;
};

// m is full's model bit for bit: its logits, its loss and, after its backward, every parameter
// and gradient.
inline void expect_is_full_model(const Transformer& m, const FullRun& full) {
  EXPECT_EQ(m.forward(full.ids).to_vector(), full.model.forward(full.ids).to_vector());
  const Tensor loss = m.loss(full.ids, full.targets);
  EXPECT_EQ(loss.item(), full.loss.item());
  autograd::backward(loss);
  for (auto& [name, p] : m.named_parameters()) {
    EXPECT_EQ(p.to_vector(), full.params.at(name).to_vector()) << name;
    EXPECT_EQ(p.grad().to_vector(), full.params.at(name).grad().to_vector()) << name;
  }
}

// A neuron-level factory's errors for a block outside its cover and a hidden size the cover does
// not have (the latter naming the config key).
inline void expect_mlp_size_errors(const LinearFactory& f, const ModelConfig& c) {
  EXPECT_THROW(f.mlp_in(c.n_layer, c.n_embd, c.ffn_hidden_size(), true, DType::kF64, {}), Error);
  try {
    f.mlp_out(0, c.ffn_hidden_size() + 1, c.n_embd, true, DType::kF64, {});
    ADD_FAILURE() << "no error for a hidden size the cover does not have";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.ffn_hidden"), std::string::npos) << e.what();
  }
}

// The block index and leaf name of an MLP parameter ("blocks.1.mlp.fc.weight" → 1,
// "fc.weight"), or -1.
inline int64_t mlp_param(const std::string& name, std::string* leaf) {
  if (name.rfind("blocks.", 0) != 0) return -1;
  const size_t dot = name.find('.', 7);
  const size_t at = name.find(".mlp.", 7);
  if (at == std::string::npos) return -1;
  *leaf = name.substr(at + 5);
  return std::stoll(name.substr(7, dot - 7));
}

// The given indices of dim `dim` of t, one narrow per unit (the test's own gather).
inline Tensor units_of(const Tensor& t, int64_t dim, const std::vector<int64_t>& units) {
  std::vector<Tensor> parts;
  for (int64_t u : units) parts.push_back(ops::narrow(t, dim, u, 1));
  return ops::contiguous(ops::cat(parts, dim));
}

// Loads `t` (named `name`) from the same-named tensor of `full` through its placement's piece
// (so a wrong placement loads wrong values).
inline void load_through_piece(const std::string& name, const Tensor& t,
                               const std::map<std::string, Tensor>& full) {
  const Tensor& f = full.at(name);
  const TensorPiece dst = piece_of(t.placement(), t.shape());
  ASSERT_EQ(dst.global_shape, f.shape()) << name;
  const int64_t n = copy_overlap(whole_piece(f.shape()), f.raw_data(), dst, t.raw_data(), 8);
  ASSERT_EQ(n, t.numel()) << name;
}

// --- Slice layouts of the MPI tests ---

// A matrix split into blocks along `dim` (dim 1: column blocks, strided views).
struct Matrix {
  int64_t rows, cols;
  int dim;
  DType dtype;
};

struct SliceDef {
  int64_t id;
  int mat;
  int64_t start, len;
  std::vector<int> holders;  // ranks of the group
};

struct Layout {
  std::vector<Matrix> mats;
  std::vector<SliceDef> slices;
};

// Holders of slice i among n ranks: k = 1, a cyclic window of 2 (slice 1 wraps: {0, n-1}), all
// n, a cyclic window of n/2, or a random set.
inline std::vector<int> holders_for(size_t i, int n, std::mt19937_64& rng) {
  const int s = i == 1 ? n - 1 : static_cast<int>(rng() % static_cast<uint64_t>(n));
  std::vector<int> h;
  auto window = [&](int k) {
    for (int j = 0; j < k; ++j) h.push_back((s + j) % n);
  };
  switch (i % 5) {
    case 0:
      window(1);
      break;
    case 1:
      window(2);
      break;
    case 2:
      window(n);
      break;
    case 3:
      window(n / 2);
      break;
    default:
      for (int r = 0; r < n; ++r) {
        if (rng() % 2) h.push_back(r);
      }
      if (h.empty()) h.push_back(s);
  }
  std::sort(h.begin(), h.end());
  return h;
}

// Cuts every matrix into runs of 1 to 6 rows or columns, holders from holders_for among n
// ranks, and numbers the slices 0 … S−1 shuffled (ascending id is not layout order); the same
// on every rank (one seed).
inline Layout cut_layout(std::vector<Matrix> mats, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Layout l;
  l.mats = std::move(mats);
  for (int m = 0; m < static_cast<int>(l.mats.size()); ++m) {
    const Matrix& mat = l.mats[static_cast<size_t>(m)];
    const int64_t extent = mat.dim == 0 ? mat.rows : mat.cols;
    for (int64_t at = 0; at < extent;) {
      const int64_t len = std::min<int64_t>(extent - at, 1 + static_cast<int64_t>(rng() % 6));
      l.slices.push_back({0, m, at, len, holders_for(l.slices.size(), n, rng)});
      at += len;
    }
  }
  std::vector<int64_t> ids(l.slices.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  for (size_t i = 0; i < ids.size(); ++i) l.slices[i].id = ids[i];
  return l;
}

// Slice s's block of its matrix in `mats` (a view).
inline Tensor block(const Layout& l, const std::vector<Tensor>& mats, const SliceDef& s) {
  const Matrix& mat = l.mats[static_cast<size_t>(s.mat)];
  return mats[static_cast<size_t>(s.mat)].narrow(mat.dim, s.start, s.len);
}

inline bool holds(const SliceDef& s, int rank) {
  return std::binary_search(s.holders.begin(), s.holders.end(), rank);
}

}  // namespace loom::parallel::sdp::test_util
