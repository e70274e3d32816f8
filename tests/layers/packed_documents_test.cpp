// tests/layers/packed_documents_test.cpp — SFT packing through the whole model (Transformer's
// doc_start overloads, Note [Packed documents] in kernels/attention.h): for a tiny GPT-2 and a
// tiny Llama in f64, with and without activation checkpointing, one packed row per batch element
// (positions restarting per document, the targets at the documents' boundaries ignored) gives
// each document's logits as the model run on that document alone, a loss equal to the
// token-weighted mean of the per-document losses, and the same parameter gradients. Also: a
// malformed host doc_start is refused by the model, and the mesh context's attention refuses
// packed documents under context parallelism (a fake two-member cp group, never used) while it
// passes them through with one member; the documents of a row draw different dropout masks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops/attention.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "parallel/mesh_layers.h"
#include "tests/gradcheck.h"
#include "tests/layers/tiny_models.h"

namespace loom {
namespace {

using testing::rel_error;

struct Packing {
  std::vector<int64_t> docs;  // lengths, summing to T
  int64_t t() const {
    int64_t n = 0;
    for (int64_t d : docs) n += d;
    return n;
  }
  Tensor positions() const {  // restarting at 0 for each document
    std::vector<int32_t> p;
    for (int64_t n : docs) {
      for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(i));
    }
    return Tensor::from_vector(p, {t()});
  }
  Tensor doc_start() const {
    std::vector<int32_t> p;
    for (int64_t n : docs) {
      const auto start = static_cast<int32_t>(p.size());
      for (int64_t i = 0; i < n; ++i) p.push_back(start);
    }
    return Tensor::from_vector(p, {t()});
  }
};

// Random targets, with each document's last token ignored except the row's last (its next
// token is another document's), and one more ignored token inside a document.
Tensor packed_targets(const Packing& pk, int64_t B, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  std::vector<double> t = randint({B, pk.t()}, 0, vocab, gen, DType::kI32).to_vector();
  std::vector<int32_t> out(t.begin(), t.end());
  for (int64_t b = 0; b < B; ++b) {
    int64_t end = 0;
    for (size_t d = 0; d + 1 < pk.docs.size(); ++d) {
      end += pk.docs[d];
      out[static_cast<size_t>(b * pk.t() + end - 1)] = -100;
    }
  }
  out[static_cast<size_t>(pk.t() + 3)] = -100;  // batch row 1, token 3
  return Tensor::from_vector(out, {B, pk.t()});
}

int64_t counted(const Tensor& targets) {
  int64_t n = 0;
  for (double v : targets.to_vector()) n += v != -100 ? 1 : 0;
  return n;
}

std::vector<Tensor> grads_of(const Transformer& m) {
  std::vector<Tensor> g;
  for (const Tensor& p : m.parameters())
    g.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
  return g;
}

void check_packed_model(ModelConfig c) {
  SCOPED_TRACE(c.arch + (c.recomputes() ? " checkpointed" : ""));
  const Packing pk{{3, 2, 3}};
  const int64_t B = 2, T = pk.t();
  Transformer model(c, DType::kF64);
  Generator init_gen(42);
  model.init_weights(init_gen);
  testing::perturb_parameters(model, 0.1, 43);
  const Tensor ids = testing::random_ids(B, T, c.vocab_size, 7);
  const Tensor targets = packed_targets(pk, B, c.vocab_size, 8);
  const Tensor pos = pk.positions(), ds = pk.doc_start();

  // Logits: each document's as the model run on it alone.
  {
    autograd::NoGradGuard no_grad;
    const Tensor logits = model.forward(ids, pos, nullptr, ds);
    int64_t a = 0;
    for (int64_t n : pk.docs) {
      const Tensor alone = model.forward(ids.narrow(1, a, n).contiguous());
      EXPECT_LT(rel_error(logits.narrow(1, a, n).contiguous(), alone), 1e-12) << "doc at " << a;
      a += n;
    }
    // Positions alone do not keep documents apart: without doc_start the later ones differ.
    const Tensor crossing = model.forward(ids, pos, nullptr);
    EXPECT_GT(rel_error(crossing, logits), 1e-6) << "doc_start had no effect";
  }

  // Loss and gradients: the token-weighted mean of the documents' losses.
  model.zero_grad();
  const Tensor packed = model.loss(ids, targets, pos, nullptr, ds);
  autograd::backward(packed);
  const std::vector<Tensor> packed_grads = grads_of(model);

  model.zero_grad();
  const int64_t total = counted(targets);
  Tensor weighted;
  double weighted_value = 0;
  int64_t a = 0;
  for (int64_t n : pk.docs) {
    const Tensor td = targets.narrow(1, a, n).contiguous();
    const int64_t cd = counted(td);
    ASSERT_GT(cd, 0);
    const Tensor ld = model.loss(ids.narrow(1, a, n).contiguous(), td);
    const double w = static_cast<double>(cd) / static_cast<double>(total);
    weighted_value += w * ld.item();
    const Tensor term = ops::scale(ld, w);
    weighted = weighted.defined() ? ops::add(weighted, term) : term;
    a += n;
  }
  autograd::backward(weighted);
  const std::vector<Tensor> doc_grads = grads_of(model);
  EXPECT_NEAR(packed.item(), weighted_value, 1e-12 * std::abs(weighted_value));
  ASSERT_EQ(packed_grads.size(), doc_grads.size());
  const auto names = model.named_parameters();
  for (size_t i = 0; i < packed_grads.size(); ++i) {
    ASSERT_EQ(packed_grads[i].defined(), doc_grads[i].defined()) << names[i].first;
    if (!packed_grads[i].defined()) continue;
    EXPECT_LT(rel_error(packed_grads[i], doc_grads[i]), 1e-10) << names[i].first;
  }
}

TEST(PackedDocuments, Gpt2PackedRowEqualsDocumentsAlone) {
  check_packed_model(testing::tiny_gpt2());
}

TEST(PackedDocuments, LlamaPackedRowEqualsDocumentsAlone) {
  check_packed_model(testing::tiny_llama());
}

// The recomputation in backward keeps the documents apart too.
TEST(PackedDocuments, CheckpointedBlocksCarryDocStart) {
  for (ModelConfig c : {testing::tiny_gpt2(), testing::tiny_llama()}) {
    c.recompute = "full";
    check_packed_model(c);
  }
}

// Note [Dropout of packed documents]: two identical documents in one row (same tokens, same
// restarting positions, attention kept apart) differ only through their dropout masks, which
// must differ — on one process and with data parallelism's batch rows, whose rows would be the
// positions otherwise. Without dropout the two documents' logits are equal, so the test can
// fail.
TEST(PackedDocuments, DocumentsOfARowDrawDifferentDropoutMasks) {
  const Packing pk{{4, 4}};
  const Tensor half = testing::random_ids(1, 4, 11, 9);
  const Tensor ids = ops::cat({half, half}, 1).contiguous();
  const DropoutKey key{5, 0, 0};
  for (double p : {0.0, 0.3}) {
    for (const Block::BatchSlice slice : {Block::BatchSlice{}, Block::BatchSlice{1, 4}}) {
      ModelConfig c = testing::tiny_gpt2();
      c.dropout = p;
      Transformer model(c, DType::kF64);
      Generator init_gen(42);
      model.init_weights(init_gen);
      model.set_batch_slice(slice);
      autograd::NoGradGuard no_grad;
      const Tensor logits = model.forward(ids, pk.positions(), &key, pk.doc_start());
      const double diff =
          rel_error(logits.narrow(1, 0, 4).contiguous(), logits.narrow(1, 4, 4).contiguous());
      if (p == 0.0) {
        EXPECT_LT(diff, 1e-14) << "slice total " << slice.total;
      } else {
        EXPECT_GT(diff, 1e-3) << "the documents shared their dropout masks, slice total "
                              << slice.total;
      }
    }
  }
}

TEST(PackedDocuments, ModelRefusesMalformedHostDocStart) {
  const ModelConfig c = testing::tiny_gpt2();
  Transformer model(c, DType::kF64);
  const Tensor ids = testing::random_ids(1, 6, c.vocab_size, 3);
  const Tensor pos = Tensor::from_vector(std::vector<int32_t>{0, 1, 0, 1, 2, 3}, {6});
  const Tensor bad = Tensor::from_vector(std::vector<int32_t>{0, 0, 1, 1, 1, 1}, {6});
  try {
    model.forward(ids, pos, nullptr, bad);
    ADD_FAILURE() << "a doc_start whose document starts before its row was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Transformer.forward: doc_start[2]"), std::string::npos) << msg;
  }
  EXPECT_THROW(model.loss(ids, ids, pos, nullptr, Tensor::zeros({5}, DType::kI32)), Error);
}

// A group that only says how big it is: the mesh attention must refuse before communicating.
class SizeOnlyCommunicator final : public parallel::Communicator {
 public:
  explicit SizeOnlyCommunicator(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  parallel::WorkPtr all_reduce_async(Tensor, parallel::ReduceOp) override { return fail(); }
  parallel::WorkPtr reduce_scatter_async(Tensor, Tensor, parallel::ReduceOp) override {
    return fail();
  }
  parallel::WorkPtr all_gather_async(Tensor, Tensor) override { return fail(); }
  parallel::WorkPtr all_to_all_async(Tensor, Tensor) override { return fail(); }
  parallel::WorkPtr broadcast_async(Tensor, int) override { return fail(); }
  parallel::WorkPtr send_async(Tensor, int, int) override { return fail(); }
  parallel::WorkPtr recv_async(Tensor, int, int) override { return fail(); }
  parallel::WorkPtr barrier_async() override { return fail(); }

 private:
  parallel::WorkPtr fail() { LOOM_FAIL("SizeOnlyCommunicator: no communication in this test"); }
  int size_;
  std::string name_ = "fake";
};

TEST(PackedDocuments, MeshAttentionRefusesContextParallelism) {
  Generator gen(5);
  const Tensor q = randn({1, 2, 6, 4}, gen, DType::kF64), k = randn({1, 2, 6, 4}, gen, DType::kF64),
               v = randn({1, 2, 6, 4}, gen, DType::kF64);
  const Tensor ds = Tensor::from_vector(std::vector<int32_t>{0, 0, 2, 2, 2, 5}, {6});
  SizeOnlyCommunicator tp(1), cp2(2), cp1(1);
  const LayerContext ring = parallel::mesh_layer_context(tp, cp2, false);
  try {
    ring.attention(q, k, v, ds);
    ADD_FAILURE() << "ring attention accepted packed documents";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("packed documents are not supported with context parallelism "
                       "(parallel.cp > 1) yet"),
              std::string::npos)
        << msg;
  }
  // One cp member: the packed attention itself.
  const LayerContext one = parallel::mesh_layer_context(tp, cp1, false);
  EXPECT_EQ(one.attention(q, k, v, ds).to_vector(),
            ops::causal_attention(q, k, v, 0.0, ds).to_vector());
  EXPECT_NE(one.attention(q, k, v, ds).to_vector(), one.attention(q, k, v, Tensor()).to_vector());
}

}  // namespace
}  // namespace loom
