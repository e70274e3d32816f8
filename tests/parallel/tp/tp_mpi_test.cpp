// tests/parallel/tp/tp_mpi_test.cpp — tensor and sequence parallelism building blocks under
// mpirun, with the whole world as the TP group (2 or 4 ranks): the matched communication ops
// against their definitions (forward and backward), a column→row parallel MLP with and without
// sequence parallelism, the vocab-parallel embedding and the vocab-parallel cross-entropy, each
// against the unsharded single-process computation done locally on every rank, and the layers
// under an f64 compute dtype with f32 masters (mixed precision), and the order in which each
// layer issues its transfers and GEMMs (the overlap). Tolerances: the
// sharded runs add partial GEMM results in a different order than the full GEMM (sums over a
// split inner dimension), so results agree to f32 rounding, checked at 2e-5 relative.
// loom-mpi-test: ranks 2 4
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops/activation.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/matmul.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "core/rng.h"
#include "parallel/tp/comm_ops.h"
#include "parallel/tp/cross_entropy.h"
#include "parallel/tp/layers.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel {
namespace {

using testing::world_size;

constexpr double kTol = 2e-5;

ParallelContext tp_world() {
  ParallelOptions o;
  o.shape = {.dp = 1, .pp = 1, .cp = 1, .tp = world_size()};
  o.comm_timeout_s = testing::kTestCommTimeoutS;
  return ParallelContext::create(o);
}

using testing::rel_err;

// Same random tensor on every rank (seeded by `salt` only).
Tensor shared_rand(uint64_t salt, const Shape& shape, double std = 1.0) {
  Generator gen(salt);
  return randn(shape, gen, DType::kF32, 0.0, std);
}

Tensor leaf(const Tensor& t) {
  Tensor l = ops::clone(t);
  l.set_requires_grad(true);
  return l;
}

Tensor chunk(const Tensor& full, int64_t dim, int rank, int n) {
  const int64_t len = full.size(dim) / n;
  return ops::contiguous(ops::narrow(full, dim, rank * len, len));
}

TEST(TensorParallelOps, ForwardAndBackwardMatchTheirDefinitions) {
  ParallelContext ctx = tp_world();
  Communicator& tp = ctx.tp();
  const int r = tp.rank(), n = tp.size();
  // Every rank's input (B=2, T=4n, C=2n) is rank-dependent; each rank can regenerate them all.
  auto input = [&](int q) {
    return shared_rand(100 + static_cast<uint64_t>(q), {2, 4 * n, 2 * n});
  };
  // Loss weights, also per rank: loss = Σ_q Σ out_q · w_q, so d out_q = w_q.
  auto weight = [&](int q, const Shape& s) {
    return shared_rand(200 + static_cast<uint64_t>(q), s);
  };
  Tensor sum_in = Tensor::zeros({2, 4 * n, 2 * n});
  Tensor sum_w_full = Tensor::zeros({2, 4 * n, 2 * n});
  for (int q = 0; q < n; ++q) {
    sum_in = ops::add(sum_in, input(q));
    sum_w_full = ops::add(sum_w_full, weight(q, {2, 4 * n, 2 * n}));
  }
  {  // copy_to_region: identity; grad = Σ_q w_q
    Tensor x = leaf(input(r));
    Tensor y = tp::copy_to_region(x, tp);
    EXPECT_LT(rel_err(input(r), y), 1e-7);
    autograd::backward(ops::sum(ops::mul(y, weight(r, y.shape()))));
    EXPECT_LT(rel_err(sum_w_full, x.grad()), kTol);
  }
  {  // reduce_from_region: Σ_q x_q; grad = w_r
    Tensor x = leaf(input(r));
    Tensor y = tp::reduce_from_region(x, tp);
    EXPECT_LT(rel_err(sum_in, y), kTol);
    autograd::backward(ops::sum(ops::mul(y, weight(r, y.shape()))));
    EXPECT_LT(rel_err(weight(r, y.shape()), x.grad()), 1e-7);
  }
  for (int64_t dim : {1, 2}) {
    // scatter_to_region along T or C: own chunk; grad = all-gather of the chunk weights
    Tensor x = leaf(input(0));  // replicated input
    Tensor y = tp::scatter_to_region(x, tp, dim);
    EXPECT_LT(rel_err(chunk(input(0), dim, r, n), y), 1e-7);
    autograd::backward(ops::sum(ops::mul(y, weight(r, y.shape()))));
    std::vector<Tensor> parts;
    for (int q = 0; q < n; ++q) parts.push_back(weight(q, y.shape()));
    EXPECT_LT(rel_err(ops::cat(parts, dim), x.grad()), 1e-7);
  }
  {  // gather_from_region along T: concatenation; grad = own chunk of w_r
    Tensor x = leaf(chunk(input(r), 1, r, n));
    Tensor y = tp::gather_from_region(x, tp, 1);
    std::vector<Tensor> parts;
    for (int q = 0; q < n; ++q) parts.push_back(chunk(input(q), 1, q, n));
    EXPECT_LT(rel_err(ops::cat(parts, 1), y), 1e-7);
    autograd::backward(ops::sum(ops::mul(y, weight(r, y.shape()))));
    EXPECT_LT(rel_err(chunk(weight(r, y.shape()), 1, r, n), x.grad()), 1e-7);
  }
  {  // gather_from_sequence: concatenation; grad = own chunk of Σ_q w_q (reduce-scatter)
    Tensor x = leaf(chunk(input(r), 1, r, n));
    Tensor y = tp::gather_from_sequence(x, tp, 1);
    autograd::backward(ops::sum(ops::mul(y, weight(r, y.shape()))));
    EXPECT_LT(rel_err(chunk(sum_w_full, 1, r, n), x.grad()), kTol);
  }
  {  // reduce_scatter_to_sequence: own chunk of Σ_q x_q; grad = all-gather of chunk weights
    Tensor x = leaf(input(r));
    Tensor y = tp::reduce_scatter_to_sequence(x, tp, 1);
    EXPECT_LT(rel_err(chunk(sum_in, 1, r, n), y), kTol);
    autograd::backward(ops::sum(ops::mul(y, weight(r, y.shape()))));
    std::vector<Tensor> parts;
    for (int q = 0; q < n; ++q) parts.push_back(weight(q, y.shape()));
    EXPECT_LT(rel_err(ops::cat(parts, 1), x.grad()), 1e-7);
  }
}

// fc (C → 4C) column-parallel, GELU, proj (4C → C) row-parallel, against the full MLP.
void check_mlp(bool sequence_parallel) {
  ParallelContext ctx = tp_world();
  Communicator& tp = ctx.tp();
  const int r = tp.rank(), n = tp.size();
  const int64_t B = 2, T = 4 * n, C = 8, H = 4 * C;
  const Tensor w1 = shared_rand(1, {H, C}, 0.3), b1 = shared_rand(2, {H}, 0.1);
  const Tensor w2 = shared_rand(3, {C, H}, 0.3), b2 = shared_rand(4, {C}, 0.1);
  const Tensor x_full = shared_rand(5, {B, T, C}), dy_full = shared_rand(6, {B, T, C});

  // Reference: the whole MLP on every rank.
  Tensor rw1 = leaf(w1), rb1 = leaf(b1), rw2 = leaf(w2), rb2 = leaf(b2), rx = leaf(x_full);
  Tensor ry = ops::add(
      ops::matmul(ops::gelu(ops::add(ops::matmul(rx, rw1, false, true), rb1)), rw2, false, true),
      rb2);
  autograd::backward(ops::sum(ops::mul(ry, dy_full)));

  tp::ColumnParallelLinear fc(C, {H}, true, tp, sequence_parallel);
  tp::RowParallelLinear proj(H, C, true, tp, sequence_parallel);
  fc.load_shard(w1, b1);
  proj.load_shard(w2, b2);
  Tensor x = leaf(sequence_parallel ? chunk(x_full, 1, r, n) : x_full);
  Tensor y = proj.forward(ops::gelu(fc.forward(x)));
  const Tensor want_y = sequence_parallel ? chunk(ry.detach(), 1, r, n) : ry.detach();
  EXPECT_LT(rel_err(want_y, y), kTol);
  const Tensor dy = sequence_parallel ? chunk(dy_full, 1, r, n) : dy_full;
  autograd::backward(ops::sum(ops::mul(y, dy)));
  // Input gradient: the full one (replicated input) or this rank's sequence chunk of it.
  EXPECT_LT(rel_err(sequence_parallel ? chunk(rx.grad(), 1, r, n) : rx.grad(), x.grad()), kTol);
  EXPECT_LT(rel_err(chunk(rw1.grad(), 0, r, n), fc.weight().grad()), kTol);
  EXPECT_LT(rel_err(chunk(rb1.grad(), 0, r, n), fc.bias().grad()), kTol);
  EXPECT_LT(rel_err(chunk(rw2.grad(), 1, r, n), proj.weight().grad()), kTol);
  // The row layer's bias is complete on every rank in both modes (under SP its gradient is
  // summed over the group in backward).
  EXPECT_LT(rel_err(rb2.grad(), proj.bias().grad()), kTol);
}

TEST(TensorParallelLayers, ColumnRowMlpMatchesTheFullMlp) { check_mlp(false); }
TEST(TensorParallelLayers, ColumnRowMlpWithSequenceParallelMatchesTheFullMlp) { check_mlp(true); }

// Mixed precision inside the TP layers (Note [Compute dtype] in layers/module.h): f32 master
// weights with an f64 compute dtype give f64 activations that match an all-f64 reference to
// f64 rounding (a layer computing in f32 would be off by ~1e-7), and f32 gradients equal to
// the f64 reference's rounded to f32.
void check_compute_dtype(bool sequence_parallel) {
  ParallelContext ctx = tp_world();
  Communicator& tp = ctx.tp();
  const int r = tp.rank(), n = tp.size();
  const int64_t B = 2, T = 2 * n, C = 8, H = 4 * C, V = 8 * n;
  auto f64 = [](const Tensor& t) { return ops::to_dtype(t, DType::kF64); };
  const Tensor w1 = shared_rand(21, {H, C}, 0.3), b1 = shared_rand(22, {H}, 0.1);
  const Tensor w2 = shared_rand(23, {C, H}, 0.3), b2 = shared_rand(24, {C}, 0.1);
  const Tensor table = shared_rand(25, {V, C});
  Generator gen(26);
  const Tensor ids = randint({B, T}, 0, V, gen, DType::kI64);
  const Tensor dy_full = f64(shared_rand(27, {B, T, C}));

  Tensor rw1 = leaf(f64(w1)), rb1 = leaf(f64(b1)), rw2 = leaf(f64(w2)), rb2 = leaf(f64(b2)),
         rt = leaf(f64(table));
  const Tensor rh =
      ops::gelu(ops::add(ops::matmul(ops::embedding(ids, rt), rw1, false, true), rb1));
  const Tensor ry = ops::add(ops::matmul(rh, rw2, false, true), rb2);
  autograd::backward(ops::sum(ops::mul(ry, dy_full)));

  tp::VocabParallelEmbedding emb(V, C, tp, sequence_parallel);
  tp::ColumnParallelLinear fc(C, {H}, true, tp, sequence_parallel);
  tp::RowParallelLinear proj(H, C, true, tp, sequence_parallel);
  emb.load_shard(table);
  fc.load_shard(w1, b1);
  proj.load_shard(w2, b2);
  for (Module* m : std::vector<Module*>{&emb, &fc, &proj}) m->set_compute_dtype(DType::kF64);
  const Tensor e = emb.forward(ids);
  const Tensor h = fc.forward(e);
  const Tensor y = proj.forward(ops::gelu(h));
  EXPECT_EQ(e.dtype(), DType::kF64);
  EXPECT_EQ(h.dtype(), DType::kF64);
  EXPECT_EQ(y.dtype(), DType::kF64);
  EXPECT_LT(rel_err(sequence_parallel ? chunk(ry.detach(), 1, r, n) : ry.detach(), y), 1e-12);
  autograd::backward(ops::sum(ops::mul(y, sequence_parallel ? chunk(dy_full, 1, r, n) : dy_full)));
  for (const Tensor& g : {emb.weight().grad(), fc.weight().grad(), fc.bias().grad(),
                          proj.weight().grad(), proj.bias().grad()}) {
    EXPECT_EQ(g.dtype(), DType::kF32);
  }
  constexpr double kF32Rounding = 1e-7;  // one rounding of the f64 gradient
  EXPECT_LT(rel_err(chunk(rt.grad(), 0, r, n), emb.weight().grad()), kF32Rounding);
  EXPECT_LT(rel_err(chunk(rw1.grad(), 0, r, n), fc.weight().grad()), kF32Rounding);
  EXPECT_LT(rel_err(chunk(rb1.grad(), 0, r, n), fc.bias().grad()), kF32Rounding);
  EXPECT_LT(rel_err(chunk(rw2.grad(), 1, r, n), proj.weight().grad()), kF32Rounding);
  EXPECT_LT(rel_err(rb2.grad(), proj.bias().grad()), kF32Rounding);
}

TEST(TensorParallelLayers, ComputeDtypeAppliesInsideTheLayers) { check_compute_dtype(false); }
TEST(TensorParallelLayers, ComputeDtypeAppliesInsideTheLayersWithSequenceParallel) {
  check_compute_dtype(true);
}

// Note [TP communication overlap] (parallel/tp/layers.cpp): each transfer is issued before the
// GEMM it hides behind. The order is read from the layer's own timeline, on the compute thread:
// the communicator's queued time of each op (stamped at issue) and each GEMM span's begin.
// Letters: S ring send, A all-gather, R reduce-scatter or all-reduce; G GEMM, X dX GEMM, W dW GEMM.
class Timeline {
 public:
  explicit Timeline(Communicator& tp) : tp_(tp) {
    sink_ = std::make_shared<tp::SpanSink>(
        [this](const std::string& what, Clock::time_point b, Clock::time_point) {
          std::lock_guard<std::mutex> lock(mu_);
          const char letter = what.find("dX") != std::string::npos   ? 'X'
                              : what.find("dW") != std::string::npos ? 'W'
                                                                     : 'G';
          events_.push_back({b, letter});
        });
    tp_.set_observer([this](const CommEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      if (e.op == "send") events_.push_back({e.queued, 'S'});
      if (e.op == "all_gather") events_.push_back({e.queued, 'A'});
      if (e.op == "reduce_scatter" || e.op == "all_reduce") events_.push_back({e.queued, 'R'});
    });
  }
  ~Timeline() { tp_.set_observer(nullptr); }
  tp::SpanSinkPtr sink() const { return sink_; }
  // The letters in time order since the last take(); waits for the observer's reports.
  std::string take() {
    tp_.barrier();  // every op this rank issued has finished and been reported
    std::lock_guard<std::mutex> lock(mu_);
    std::stable_sort(events_.begin(), events_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string out;
    for (const auto& [t, c] : events_) out += c;
    events_.clear();
    return out;
  }

 private:
  using Clock = std::chrono::steady_clock;
  Communicator& tp_;
  std::mutex mu_;
  std::vector<std::pair<Clock::time_point, char>> events_;
  tp::SpanSinkPtr sink_;
};

TEST(TensorParallelLayers, TransfersAreIssuedBeforeTheGemmsTheyHide) {
  ParallelContext ctx = tp_world();
  Communicator& tp = ctx.tp();
  const int r = tp.rank(), n = tp.size();
  const int64_t B = 2, T = 4 * n, C = 8, H = 4 * C;
  std::string ring_fwd, ring_bwd, row_fwd;
  for (int i = 0; i < n - 1; ++i) {
    ring_fwd += "SG";   // column forward: pass the held chunk on, multiply it
    row_fwd += "GS";    // row forward: multiply the next chunk, then pass the partial sum on
    ring_bwd += "SXW";  // row backward: pass dY's chunk on, its dX rows and dW share
  }
  ring_fwd += "G";
  row_fwd += "G";
  ring_bwd += "XW";
  Timeline line(tp);
  for (bool sp : {true, false}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    tp::ColumnParallelLinear fc(C, {H}, true, tp, sp, DType::kF32, {}, line.sink());
    tp::RowParallelLinear proj(H, C, true, tp, sp, DType::kF32, {}, line.sink());
    fc.load_shard(shared_rand(31, {H, C}, 0.3), shared_rand(32, {H}, 0.1));
    proj.load_shard(shared_rand(33, {C, H}, 0.3), shared_rand(34, {C}, 0.1));
    Tensor x = leaf(sp ? chunk(shared_rand(35, {B, T, C}), 1, r, n) : shared_rand(35, {B, T, C}));
    line.take();
    const Tensor h = fc.forward(x);
    EXPECT_EQ(line.take(), sp ? ring_fwd : "G");
    const Tensor y = proj.forward(h);
    EXPECT_EQ(line.take(),
              sp ? row_fwd : "GRGR");  // the first half's all-reduce runs under the second GEMM
    Tensor h_leaf = leaf(h.detach());
    const Tensor y2 = proj.forward(h_leaf);
    line.take();
    autograd::backward(ops::sum(ops::mul(y2, shared_rand(36, y2.shape()))));
    // (SP: first the replicated bias's gradient all-reduce, Note [Gradients of replicated
    // parameters])
    EXPECT_EQ(line.take(), sp ? "R" + ring_bwd : "XW");
    const Tensor y3 = fc.forward(x);
    line.take();
    autograd::backward(ops::sum(ops::mul(y3, shared_rand(37, y3.shape()))));
    // Note [Column-parallel backward overlap]: re-gather, dX, its reduction, dW.
    EXPECT_EQ(line.take(), sp ? "AXRW" : "XRW");
    (void)y;
  }
}

TEST(TensorParallelLayers, VocabParallelEmbeddingMatchesTheFullTable) {
  for (bool sp : {false, true}) {
    ParallelContext ctx = tp_world();
    Communicator& tp = ctx.tp();
    const int r = tp.rank(), n = tp.size();
    const int64_t V = 16 * n, C = 6, B = 2, T = 2 * n;
    const Tensor table = shared_rand(7, {V, C});
    Generator gen(8);
    const Tensor ids = randint({B, T}, 0, V, gen, DType::kI64);
    const Tensor dy_full = shared_rand(9, {B, T, C});
    Tensor rt = leaf(table);
    Tensor ry = ops::embedding(ids, rt);
    autograd::backward(ops::sum(ops::mul(ry, dy_full)));

    tp::VocabParallelEmbedding emb(V, C, tp, sp);
    emb.load_shard(table);
    Tensor y = emb.forward(ids);
    EXPECT_LT(rel_err(sp ? chunk(ry.detach(), 1, r, n) : ry.detach(), y), 1e-7) << "sp " << sp;
    autograd::backward(ops::sum(ops::mul(y, sp ? chunk(dy_full, 1, r, n) : dy_full)));
    // Complete in both modes: with SP the reduce-scatter's backward all-gathers the output
    // gradient, so every rank sees every token's gradient for its own rows.
    EXPECT_LT(rel_err(chunk(rt.grad(), 0, r, n), emb.weight().grad()), kTol) << "sp " << sp;
  }
}

// An id past the whole vocabulary, given on the host, is the single-process lookup's error on
// every rank (each checks the same ids before any communication); before this check it was
// masked on every rank and looked up as a zero row.
TEST(TensorParallelLayers, VocabParallelEmbeddingRejectsHostIdsPastTheVocabulary) {
  ParallelContext ctx = tp_world();
  Communicator& tp = ctx.tp();
  const int64_t V = 16 * tp.size();
  tp::VocabParallelEmbedding emb(V, 4, tp, false);
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{0, V - 1, V, 1}, {1, 4});
  try {
    emb.forward(ids);
    ADD_FAILURE() << "expected an error for id " << V;
  } catch (const Error& e) {
    const std::string want =
        "embedding: id " + std::to_string(V) +
        " at position 2 is out of range for a vocabulary of V=" + std::to_string(V);
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  EXPECT_EQ(emb.forward(ops::narrow(ids, 1, 0, 2)).size(1),
            2);  // in range: still collective and fine
}

TEST(TensorParallelLayers, VocabParallelCrossEntropyMatchesTheGatheredLoss) {
  ParallelContext ctx = tp_world();
  Communicator& tp = ctx.tp();
  const int r = tp.rank(), n = tp.size();
  const int64_t Vp = 8 * n, V = Vp - 3, N = 37;  // padded vocabulary: the last rank has padding
  const Tensor logits = shared_rand(10, {N, Vp}, 3.0);
  std::vector<int64_t> t(N);
  Generator gen(11);
  const std::vector<double> draws = randint({N}, 0, V, gen, DType::kI64).to_vector();
  for (int64_t i = 0; i < N; ++i)
    t[static_cast<size_t>(i)] =
        i % 5 == 0 ? -100 : static_cast<int64_t>(draws[static_cast<size_t>(i)]);
  const Tensor targets = Tensor::from_vector(t, {N});

  Tensor full = leaf(logits);
  Tensor want = ops::softmax_cross_entropy(full, targets, -100, V);
  autograd::backward(want);

  Tensor local = leaf(chunk(logits, 1, r, n));
  Tensor got = tp::vocab_parallel_cross_entropy(local, targets, -100, V, tp);
  EXPECT_LT(std::abs(got.item() - want.item()), 1e-5 * std::abs(want.item()));
  autograd::backward(got);
  EXPECT_LT(rel_err(chunk(full.grad(), 1, r, n), local.grad()), kTol);
}

}  // namespace
}  // namespace loom::parallel
