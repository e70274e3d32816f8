// tests/parallel/mesh_layers_mpi_test.cpp — one Transformer built with mesh_layer_context over
// the tp and cp groups (tensor parallelism with and without sequence parallelism, context
// parallelism with ring attention, and both), GPT-2 and Llama (grouped-query heads), against
// the single-process model computed on every rank: the same loss, and every parameter's
// gradient equal to its part of the single-process gradient once the partial gradients are
// summed as the trainer does (Note [Gradients of replicated parameters]). The sharding layout
// is restated here by parameter name, independently of parallel/tp/layers.cpp. Tolerance 2e-5
// relative: the split GEMMs and the ring merge add the same terms in another order.
// loom-mpi-test: ranks 2 4
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops/view.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "parallel/cp/ring_attention.h"
#include "parallel/mesh_layers.h"
#include "parallel/tp/comm_ops.h"
#include "tests/parallel/mpi_test_util.h"
#include "tests/parallel/tp/tp_test_util.h"

namespace loom::parallel {
namespace {

constexpr int64_t kB = 2, kT = 16;

using testing::rel_err;

ModelConfig tiny(bool llama) {
  ModelConfig c;
  c.arch = llama ? "llama" : "gpt2";
  c.vocab_size = 61;  // padded to 64: the last TP rank holds padding rows
  c.vocab_multiple = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = llama ? 2 : 0;
  c.n_embd = 32;
  c.max_seq_len = kT;
  c.tie_embeddings = !llama;
  c.ffn_hidden = llama ? 48 : 0;
  return c;
}

using testing::expected_tp_part;

struct Layout {
  int tp, cp;
  bool sp;
};

void check(bool llama, Layout lay) {
  if (testing::world_size() != lay.tp * lay.cp)
    GTEST_SKIP() << "needs " << lay.tp * lay.cp << " ranks";
  SCOPED_TRACE(::testing::Message() << (llama ? "llama" : "gpt2") << " tp" << lay.tp << " cp"
                                    << lay.cp << (lay.sp ? " sp" : ""));
  const ModelConfig c = tiny(llama);
  Generator data(77);
  const Tensor ids = randint({kB, kT}, 0, c.vocab_size, data, DType::kI64);
  Tensor targets = randint({kB, kT}, 0, c.vocab_size, data, DType::kI64);
  {  // a few ignored targets
    std::vector<double> t = targets.to_vector();
    t[3] = t[20] = -100;
    std::vector<int64_t> ti(t.begin(), t.end());
    targets = Tensor::from_vector(ti, {kB, kT});
  }

  Transformer ref(c);
  Generator g1(1234);
  ref.init_weights(g1);
  Tensor ref_loss = ref.loss(ids, targets);
  autograd::backward(ref_loss);
  std::map<std::string, Tensor> ref_grads;
  for (const auto& [name, p] : ref.named_parameters()) ref_grads[name] = p.grad();

  ParallelOptions o;
  o.shape = {.dp = 1, .pp = 1, .cp = lay.cp, .tp = lay.tp};
  o.comm_timeout_s = testing::kTestCommTimeoutS;
  ParallelContext ctx = ParallelContext::create(o);
  const LayerContext layers = mesh_layer_context(ctx.tp(), ctx.cp(), lay.sp);
  Transformer model(c, DType::kF32, Device::cpu(), layers);
  Generator g2(1234);
  model.init_weights(g2);
  const int cr = ctx.cp().rank(), cn = ctx.cp().size();
  const Tensor ids_l = cp::shard_sequence(ids, 1, cr, cn);
  const Tensor targets_l = cp::shard_sequence(targets, 1, cr, cn);
  const Tensor pos = cp::cp_positions(kT, cr, cn);
  // The layout cuts the same tokens and positions (what the step runners feed the model), and
  // its activation rows are this TP rank's chunk of them under sequence parallelism.
  EXPECT_EQ(rel_err(layers.layout->local_sequence(ids, 1), ids_l), 0.0);
  EXPECT_EQ(rel_err(layers.layout->local_positions(kT), pos), 0.0);
  EXPECT_EQ(layers.layout->row_positions(pos).size(0), lay.sp ? kT / cn / lay.tp : kT / cn);
  Tensor loss = model.loss(ids_l, targets_l, pos, nullptr);
  autograd::backward(loss);

  const double total = tp::all_reduce_sum(loss.detach(), ctx.cp()).item();
  EXPECT_NEAR(total, ref_loss.item(), 2e-5 * std::abs(ref_loss.item()));

  const int tr = ctx.tp().rank(), tn = ctx.tp().size();
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    const Tensor g = tp::all_reduce_sum(p.grad(), ctx.cp());
    const Tensor want = expected_tp_part(name, ref_grads.at(name), c, tr, tn);
    // The placement the TP layers wrote (Note [Placement]) names exactly this part.
    const Placement pl = p.placement();
    EXPECT_EQ(pl.global_shape, ref_grads.at(name).shape()) << name;
    if (tn > 1) {
      EXPECT_EQ(pl.split_over(kAxisTp) != nullptr, want.numel() != ref_grads.at(name).numel())
          << name;
    }
    EXPECT_EQ(rel_err(want, testing::part_at(ref_grads.at(name), pl)), 0.0)
        << name << ": " << placement_str(pl);
    EXPECT_LT(rel_err(want, g), 2e-5) << name;
  }
  // The parameters themselves start as parts of the single-process ones.
  const auto ref_params = ref.named_parameters();
  const auto params = model.named_parameters();
  ASSERT_EQ(ref_params.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(rel_err(expected_tp_part(params[i].first, ref_params[i].second, c, tr, tn),
                      params[i].second),
              0.0)
        << params[i].first;
  }
}

// Note [TP communication volume]: per transformer block, with S = B·T·C·4 bytes (the full
// sequence's activations; each op's CommEvent.bytes is its full message, like S for an
// all-gather's output or a reduce-scatter's input, S/n for one ring transfer), tensor
// parallelism moves (the ops' shapes follow Note [TP communication overlap] in
// parallel/tp/layers.cpp)
//   without SP: 4 all-reduces' worth of S: attn.proj and mlp.proj forward, each as two
//               all-reduces of S/2 (the halves of the rows), and the qkv and fc input
//               gradients, one all-reduce of S each;
//   with SP:    the equivalent of 6 all-gathers of S and 4 reduce-scatters of S: the qkv and
//               fc inputs forward (ring all-gathers: n−1 sends and receives of S/n each),
//               again in their backward (all-gathers of S — the full input is not kept), the
//               row layers' backward (ring all-gathers of dY), the row outputs forward (ring
//               reduce-scatters) and the column input grads backward (reduce-scatters of S),
//               plus an all-reduce of the gradient of each replicated parameter used on a
//               sequence chunk (ln_1, ln_2 weight and bias, the two row biases: 6 of C·4 bytes);
// plus, once per model, the embedding (all-reduce; or reduce-scatter and its all-gather; with
// SP also the ln_f and wpe gradients), the head input (its gradient all-reduce; or all-gather
// and its reduce-scatter) and the loss (an
// all-gather of the (N) local log-sum-exps, n·N·4 bytes, and an all-reduce of the N target
// logits). Per rank a ring all-reduce sends 2(n−1)/n of its bytes and an all-gather or
// reduce-scatter (n−1)/n, so a block costs 8(n−1)/n·S without SP and 10(n−1)/n·S with it.
TEST(MeshLayerContext, TensorParallelCommunicationMatchesTheAnalyticCount) {
  const int n = testing::world_size();
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    ModelConfig c = tiny(false);
    c.n_head = 4 * n / 2 > 4 ? 4 * n / 2 : 4;
    ParallelOptions o;
    o.shape = {.dp = 1, .pp = 1, .cp = 1, .tp = n};
    o.comm_timeout_s = testing::kTestCommTimeoutS;
    ParallelContext ctx = ParallelContext::create(o);
    Transformer model(c, DType::kF32, Device::cpu(), mesh_layer_context(ctx.tp(), ctx.cp(), sp));
    Generator gen(5);
    model.init_weights(gen);
    const Tensor ids = randint({kB, kT}, 0, c.vocab_size, gen, DType::kI64);
    std::mutex mu;
    std::map<std::pair<std::string, int64_t>, int> seen;
    ctx.tp().set_observer([&](const CommEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      ++seen[{e.op, e.bytes}];
    });
    autograd::backward(model.loss(ids, ids));
    ctx.tp().barrier();
    ctx.tp().set_observer(nullptr);

    const int64_t S = kB * kT * c.n_embd * 4, N = kB * kT, L = c.n_layer;
    std::map<std::pair<std::string, int64_t>, int> want;
    want[{"all_gather", n * N * 4}] += 1;  // loss: the local log-sum-exps
    want[{"all_reduce", N * 4}] += 1;      // loss: the target logits
    if (sp) {
      want[{"all_gather", S}] += static_cast<int>(2 * L + 2);
      want[{"reduce_scatter", S}] += static_cast<int>(2 * L + 2);
      // 6 rings per block (2 column forward, 2 row forward, 2 row backward), n−1 steps each
      want[{"send", S / n}] += static_cast<int>(6 * L * (n - 1));
      want[{"recv", S / n}] += static_cast<int>(6 * L * (n - 1));
      want[{"all_reduce", c.n_embd * 4}] += static_cast<int>(6 * L + 2);  // norms, row biases
      want[{"all_reduce", c.max_seq_len * c.n_embd * 4}] += 1;            // wpe
    } else {
      want[{"all_reduce", S}] += static_cast<int>(2 * L + 2);
      want[{"all_reduce", S / 2}] += static_cast<int>(4 * L);  // the row layers' halves
    }
    want[{"barrier", 0}] += 1;
    EXPECT_EQ(seen, want);
  }
}

TEST(MeshLayerContext, Tp2Gpt2) { check(false, {2, 1, false}); }
TEST(MeshLayerContext, Tp2Llama) { check(true, {2, 1, false}); }
TEST(MeshLayerContext, Tp2SequenceParallelGpt2) { check(false, {2, 1, true}); }
TEST(MeshLayerContext, Tp2SequenceParallelLlama) { check(true, {2, 1, true}); }
TEST(MeshLayerContext, Cp2Gpt2) { check(false, {1, 2, false}); }
TEST(MeshLayerContext, Cp2Llama) { check(true, {1, 2, false}); }
TEST(MeshLayerContext, Cp4Gpt2) { check(false, {1, 4, false}); }
TEST(MeshLayerContext, Tp2Cp2Gpt2) { check(false, {2, 2, false}); }
TEST(MeshLayerContext, Tp2Cp2SequenceParallelLlama) { check(true, {2, 2, true}); }
TEST(MeshLayerContext, Tp4SequenceParallelGpt2) { check(false, {4, 1, true}); }

}  // namespace
}  // namespace loom::parallel
