// tests/layers/sliding_window_test.cpp — Mistral's sliding-window attention through the whole
// model (model.sliding_window, Note [Sliding window] in layers/transformer.cpp), tiny Llama in
// f64: with one layer, each row's logits are those of the model run on its window alone (the W
// tokens up to it, at their own positions), also over packed documents (the window never
// reaches before the row's document); with two layers the window changes the logits (a row
// sees further through the layer below, so no per-row equality holds); activation checkpointing
// recomputes with the same window (same loss and gradients); sequences no longer than the
// window are plain causal attention, bit for bit. The config is refused under context
// parallelism with ring attention for sequences longer than the window, naming
// model.sliding_window, and accepted with Ulysses attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "tests/gradcheck.h"
#include "tests/layers/tiny_models.h"
#include "train/config.h"

namespace loom {
namespace {

using testing::rel_error;

constexpr int64_t kWindow = 3;

ModelConfig windowed(int64_t layers) {
  ModelConfig c = testing::tiny_llama();
  c.n_layer = layers;
  c.max_seq_len = 16;
  c.sliding_window = kWindow;
  return c;
}

std::unique_ptr<Transformer> make_model(const ModelConfig& c) {
  auto m = std::make_unique<Transformer>(c, DType::kF64);
  Generator gen(42);
  m->init_weights(gen);
  testing::perturb_parameters(*m, 0.1, 43);
  return m;
}

Tensor i32(const std::vector<int32_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

// For each row i of one batch row of `ids` with positions `pos` and document starts `docs`
// (empty: one document), the model's logits at i equal its last row run on tokens first..i alone
// (first = max(document start, i − W + 1)) at their own positions.
void expect_rows_equal_their_windows(const Transformer& m, const Tensor& ids,
                                     const std::vector<int32_t>& pos,
                                     const std::vector<int32_t>& docs) {
  autograd::NoGradGuard no_grad;
  const int64_t T = ids.size(1);
  const Tensor logits = m.forward(ids, i32(pos), nullptr, docs.empty() ? Tensor() : i32(docs));
  for (int64_t i = 0; i < T; ++i) {
    const int64_t doc = docs.empty() ? 0 : docs[static_cast<size_t>(i)];
    const int64_t first = std::max(doc, i - kWindow + 1), n = i - first + 1;
    const std::vector<int32_t> p(pos.begin() + first, pos.begin() + i + 1);
    const Tensor alone = m.forward(ids.narrow(1, first, n).contiguous(), i32(p), nullptr);
    EXPECT_LT(
        rel_error(logits.narrow(1, i, 1).contiguous(), alone.narrow(1, n - 1, 1).contiguous()),
        1e-12)
        << "row " << i;
  }
}

TEST(SlidingWindow, OneLayerRowsEqualTheirWindowsAlone) {
  const auto m = make_model(windowed(1));
  const int64_t T = 11;
  std::vector<int32_t> pos(T);
  for (int64_t i = 0; i < T; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  expect_rows_equal_their_windows(*m, testing::random_ids(1, T, 11, 5), pos, {});
}

TEST(SlidingWindow, OneLayerWindowStaysInsideItsDocument) {
  const auto m = make_model(windowed(1));
  // Documents of 2, 6 and 4 tokens: the first shorter than the window, the others longer.
  const std::vector<int32_t> pos = {0, 1, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3},
                             docs = {0, 0, 2, 2, 2, 2, 2, 2, 8, 8, 8, 8};
  expect_rows_equal_their_windows(*m, testing::random_ids(1, 12, 11, 6), pos, docs);
}

TEST(SlidingWindow, ChangesTheLogitsOnlyPastTheWindow) {
  ModelConfig plain = windowed(2);
  plain.sliding_window = 0;
  const auto a = make_model(windowed(2)), b = make_model(plain);
  autograd::NoGradGuard no_grad;
  // No longer than the window: the causal mask is the window, bit for bit.
  const Tensor short_ids = testing::random_ids(2, kWindow, 11, 7);
  EXPECT_EQ(a->forward(short_ids).to_vector(), b->forward(short_ids).to_vector());
  // Longer: the first W rows agree, the later ones do not.
  const Tensor ids = testing::random_ids(2, 10, 11, 8);
  const Tensor la = a->forward(ids), lb = b->forward(ids);
  EXPECT_LT(rel_error(la.narrow(1, 0, kWindow).contiguous(), lb.narrow(1, 0, kWindow).contiguous()),
            1e-12);
  EXPECT_GT(rel_error(la.narrow(1, kWindow, 7).contiguous(), lb.narrow(1, kWindow, 7).contiguous()),
            1e-6);
}

std::vector<Tensor> loss_and_grads(const ModelConfig& c, const Tensor& ids) {
  const auto m = make_model(c);
  const Tensor loss = m->loss(ids, ids);
  autograd::backward(loss);
  std::vector<Tensor> out = {loss.detach()};
  for (const Tensor& p : m->parameters()) out.push_back(p.grad().clone());
  return out;
}

TEST(SlidingWindow, CheckpointedBlocksRecomputeWithTheWindow) {
  ModelConfig c = windowed(2);
  const Tensor ids = testing::random_ids(2, 10, 11, 9);
  const std::vector<Tensor> plain = loss_and_grads(c, ids);
  c.recompute = "full";
  const std::vector<Tensor> ckpt = loss_and_grads(c, ids);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_LT(rel_error(plain[i], ckpt[i]), 1e-12) << "tensor " << i;
}

TEST(SlidingWindow, ContextParallelismIsRefusedPastTheWindow) {
  const std::string model =
      "model: {arch: llama, n_layer: 1, n_head: 2, n_embd: 8, vocab_size: 11, max_seq_len: 16, "
      "sliding_window: 4}\ndata: {train: x_*.bin, batch_size: 1, seq_len: ";
  try {
    parse_config_text(model + "8}\nparallel: {cp: 2}\n", {});
    ADD_FAILURE() << "cp 2 over sequences longer than the window was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.sliding_window"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(parse_config_text(model + "4}\nparallel: {cp: 2}\n", {}));
  // Ulysses attends whole sequences (Note [Ulysses] in parallel/cp/ulysses.h): accepted.
  EXPECT_NO_THROW(parse_config_text(model + "8}\nparallel: {cp: 2, cp_attention: ulysses}\n", {}));
  EXPECT_NO_THROW(parse_config_text(model + "8}\n", {}));
}

}  // namespace
}  // namespace loom
