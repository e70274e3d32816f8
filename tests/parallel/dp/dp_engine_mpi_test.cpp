// tests/parallel/dp/dp_engine_mpi_test.cpp — the DataParallel engine's mechanics: bucket planning
// (reverse order, byte budget, dtype split, shard padding, tables alone), overlap proven from
// the engine's own event log (Note [Data-parallel event log]), accumulation micro-batches
// launching nothing, a tied table's early part and sparse rows (Note [Early contributions and
// sparse rows]), per-rank memory against Note [ZeRO memory formulas], and sharded optimiser
// state names and coverage.
// loom-mpi-test: ranks 2 4
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/ops/activation.h"
#include "core/ops/matmul.h"
#include "core/ops/reduce.h"
#include "optim/sgd.h"
#include "parallel/dp/bucket.h"
#include "tests/parallel/dp/dp_test_util.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel {
namespace {

using testing::dp_config;
using testing::dp_layout;

TEST(DataParallelBuckets, ReverseOrderBudgetDtypeAndPadding) {
  const std::vector<Tensor> params = {Tensor::zeros({10}), Tensor::zeros({2, 5}),
                                      Tensor::zeros({5}, DType::kF64), Tensor::zeros({100}),
                                      Tensor::zeros({3})};
  // Reverse: [4] 3 el, [3] 100 el (400 B > budget: closes [4], alone), [2] f64, [1]+[0].
  const auto plans = dp::plan_buckets(params, 100, 2);
  ASSERT_EQ(plans.size(), 4u);
  EXPECT_EQ(plans[0].params, (std::vector<size_t>{4}));
  EXPECT_EQ(plans[1].params, (std::vector<size_t>{3}));
  EXPECT_EQ(plans[2].params, (std::vector<size_t>{2}));
  EXPECT_EQ(plans[2].dtype, DType::kF64);
  EXPECT_EQ(plans[3].params, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(plans[3].offsets, (std::vector<int64_t>{0, 10}));
  EXPECT_EQ(plans[3].numel, 20);
  EXPECT_EQ(plans[3].padded_numel, 32);  // multiple of 2 shards × 16 elements
  EXPECT_EQ(plans[3].shard_numel, 16);
  EXPECT_EQ(plans[1].padded_numel, 128);
  // A parameter flagged `alone` closes the bucket before it and gets its own.
  const auto split = dp::plan_buckets(params, 1000, 2, {false, true, false, false, false});
  ASSERT_EQ(split.size(), 4u);
  EXPECT_EQ(split[2].params, (std::vector<size_t>{1}));
  EXPECT_EQ(split[3].params, (std::vector<size_t>{0}));
}

TEST(DataParallelBuckets, RehomedParameterSharesTheFlatBuffer) {
  Tensor p = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor alias = p;  // another handle to the same TensorImpl (as a layer's member would be)
  Tensor flat = Tensor::zeros({16});
  dp::rehome_parameter(p, flat, 5);
  EXPECT_EQ(flat.to_vector()[5], 1.0);
  EXPECT_EQ(flat.to_vector()[10], 6.0);
  flat.data<float>()[7] = 42.0f;
  EXPECT_EQ(alias.at({0, 2}), 42.0);
  EXPECT_TRUE(alias.is_contiguous());
}

// Trains `steps` steps with `micro` micro-batches on dp = world and checks each step's log.
void check_overlap(int zero_stage, int micro) {
  const int world = testing::world_size();
  ParallelContext ctx =
      ParallelContext::create(dp_layout(world, world, 0, testing::kTestCommTimeoutS));
  Transformer model(testing::dp_tiny_gpt());
  Generator gen(testing::kInitSeed);
  model.init_weights(gen);
  DataParallel dp(model.named_parameters(), ctx.dp(), dp_config(zero_stage, 4 << 10));
  const int n_params = static_cast<int>(model.named_parameters().size());
  ASSERT_GE(dp.num_buckets(), 4);
  for (int s = 0; s < 3;
       ++s) {  // steps 2+: hooks fire in backward every step (Note [Gradient-ready hooks])
    SCOPED_TRACE(::testing::Message() << "step " << s);
    auto [ids, targets] = testing::global_batch(s);
    dp.zero_grad();
    for (int m = 0; m < micro; ++m) {
      dp.set_sync(m == micro - 1);
      Tensor loss =
          model.loss(ids.narrow(0, m, 1).contiguous(), targets.narrow(0, m, 1).contiguous());
      autograd::backward(ops::scale(loss, 1.0 / micro));
    }
    dp.finish_gradient_sync();
    const DpStepStats& st = dp.last_step_stats();
    EXPECT_EQ(st.count(DpEventKind::kHook), n_params * micro);
    EXPECT_EQ(st.count(DpEventKind::kLaunch), dp.num_buckets());
    EXPECT_EQ(st.count(DpEventKind::kLateLaunch), 0);
    // The proof of overlap: a reduction was issued while gradients were still being produced.
    EXPECT_LT(st.first_seq(DpEventKind::kLaunch), st.last_seq(DpEventKind::kHook));
    EXPECT_LT(st.last_seq(DpEventKind::kLaunch), st.first_seq(DpEventKind::kFinishBegin));
    EXPECT_EQ(st.launched_early_bytes, st.grad_bytes);
    EXPECT_DOUBLE_EQ(st.overlap_fraction(), 1.0);
    if (micro > 1) {  // nothing launched during the non-sync micro-batches
      uint64_t last_hook_of_first_micro = 0;
      int hooks = 0;
      for (const DpEvent& e : st.events) {
        if (e.kind == DpEventKind::kHook && ++hooks == n_params) last_hook_of_first_micro = e.seq;
      }
      EXPECT_GT(st.first_seq(DpEventKind::kLaunch), last_hook_of_first_micro);
    }
    dp.step(testing::kLr);
  }
}

TEST(DataParallelOverlap, Zero0ReductionStartsBeforeLastGradient) { check_overlap(0, 1); }

// With overlap switched off every reduction is launched late, after backward, and the
// gradients are the same as with overlap.
TEST(DataParallelOverlap, SwitchedOffLaunchesEverythingAfterBackward) {
  const int world = testing::world_size();
  ParallelContext ctx =
      ParallelContext::create(dp_layout(world, world, 0, testing::kTestCommTimeoutS));
  std::vector<std::vector<double>> grads;
  for (bool overlap : {true, false}) {
    Transformer model(testing::dp_tiny_gpt());
    Generator gen(testing::kInitSeed);
    model.init_weights(gen);
    DataParallelConfig cfg = dp_config(0, 4 << 10);
    cfg.overlap = overlap;
    DataParallel dp(model.named_parameters(), ctx.dp(), cfg);
    auto [ids, targets] = testing::global_batch(0);
    dp.zero_grad();
    dp.set_sync(true);
    autograd::backward(model.loss(ids, targets));
    dp.finish_gradient_sync();
    const DpStepStats& st = dp.last_step_stats();
    EXPECT_EQ(st.count(DpEventKind::kLaunch), overlap ? dp.num_buckets() : 0);
    EXPECT_EQ(st.count(DpEventKind::kLateLaunch), overlap ? 0 : dp.num_buckets());
    EXPECT_DOUBLE_EQ(st.overlap_fraction(), overlap ? 1.0 : 0.0);
    std::vector<double> g;
    for (const auto& [name, p] : model.named_parameters()) {
      const auto v = p.grad().to_vector();
      g.insert(g.end(), v.begin(), v.end());
    }
    grads.push_back(g);
  }
  // The same reductions, but with overlap on, the tied embedding's output-projection part is
  // all-reduced apart from its lookup part (Note [Early contributions and sparse rows]): the
  // sum of two averages rounds differently from the average of the sum.
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_NEAR(grads[0][i], grads[1][i], 1e-7) << i;
}
TEST(DataParallelOverlap, Zero2ReductionStartsBeforeLastGradient) { check_overlap(2, 1); }
TEST(DataParallelOverlap, AccumulationLaunchesOnlyOnLastMicroBatch) { check_overlap(1, 2); }

// Note [Early contributions and sparse rows]: a tied table 16× taller than wide (vocabulary 512,
// width 32), of which the batches touch ids below 64. On each step's sync micro-batch the output
// projection's contribution is all-reduced early, before backward reaches the lookup, and the
// table's bucket is reduced by rows after backward (at most 64 of 512 rows sent); the
// accumulation micro-batch takes neither shortcut; the table stays on the sparse path on the
// next step; and every gradient equals the single-process gradient of the global batch.
TEST(DataParallelShortcuts, TiedTableEarlyPartAndSparseRows) {
  const int world = testing::world_size();
  ParallelContext ctx =
      ParallelContext::create(dp_layout(world, world, 0, testing::kTestCommTimeoutS));
  ModelConfig mc = testing::dp_tiny_gpt();
  mc.vocab_size = 512;
  Transformer model(mc), ref(mc);
  Generator gen(testing::kInitSeed), gen_ref(testing::kInitSeed);
  model.init_weights(gen);
  ref.init_weights(gen_ref);
  DataParallel dp(model.named_parameters(), ctx.dp(), dp_config(0, 4 << 10));
  const int micro = 2;
  const int64_t rows = testing::kGlobalBatch / world / micro;  // per micro-batch
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(::testing::Message() << "step " << s);
    auto [ids, targets] = testing::global_batch(s);
    dp.zero_grad();
    for (int m = 0; m < micro; ++m) {
      dp.set_sync(m == micro - 1);
      const int64_t at = (ctx.dp_rank() * micro + m) * rows;
      Tensor loss = model.loss(ids.narrow(0, at, rows).contiguous(),
                               targets.narrow(0, at, rows).contiguous());
      autograd::backward(ops::scale(loss, 1.0 / micro));
    }
    dp.finish_gradient_sync();
    const DpStepStats& st = dp.last_step_stats();
    ASSERT_EQ(st.count(DpEventKind::kEarlyLaunch), 1);
    ASSERT_EQ(st.count(DpEventKind::kSparseRows), 1);
    EXPECT_EQ(st.count(DpEventKind::kDeferred), 1);
    uint64_t table_hook = 0;  // the lookup's (final) hook of the sync micro-batch
    for (const DpEvent& e : st.events) {
      if (e.kind == DpEventKind::kHook && e.detail == "wte.weight") table_hook = e.seq;
      if (e.kind == DpEventKind::kEarlyLaunch) {
        EXPECT_EQ(e.detail, "wte.weight");
      }
      if (e.kind == DpEventKind::kSparseRows) {
        const std::string head = "wte.weight: ";
        ASSERT_EQ(e.detail.rfind(head, 0), 0u) << e.detail;
        EXPECT_LE(std::stoi(e.detail.substr(head.size())), 64) << e.detail;
        EXPECT_NE(e.detail.find(" of 512 rows"), std::string::npos) << e.detail;
      }
    }
    EXPECT_LT(st.first_seq(DpEventKind::kEarlyLaunch), table_hook);
    EXPECT_GT(st.first_seq(DpEventKind::kSparseRows), st.first_seq(DpEventKind::kFinishBegin));
    EXPECT_DOUBLE_EQ(st.overlap_fraction(), 1.0);  // the table's dense part went in backward

    ref.zero_grad();
    autograd::backward(ref.loss(ids, targets));
    const NamedTensors got = model.named_parameters(), want = ref.named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      const std::vector<double> a = got[i].second.grad().to_vector();
      const std::vector<double> b = want[i].second.grad().to_vector();
      double worst = 0;
      for (size_t k = 0; k < a.size(); ++k) worst = std::max(worst, std::abs(a[k] - b[k]));
      EXPECT_LE(worst, 1e-6) << got[i].first;
    }
  }
}

// Identity whose backward logs a marker: the engine's log then shows where backward compute
// was when each reduction was issued.
Tensor marker(const Tensor& x, DataParallel& dp, int k) {
  Tensor y = x.detach();
  autograd::record_function("marker", {x}, {&y}, [&dp, k](const std::vector<Tensor>& g) {
    dp.mark("backward of layer " + std::to_string(k));
    return std::vector<Tensor>{g[0]};
  });
  return y;
}

// A chain of gelu(h·W_k) layers, one bucket per layer, markers between layers. Overlap with
// compute means a bucket's reduction is issued while earlier layers' backward is still to run,
// on every step (step 0 and later: Note [Gradient-ready hooks] in core/autograd.h).
TEST(DataParallelOverlap, ReductionStartsWhileBackwardStillComputes) {
  const int world = testing::world_size();
  ParallelContext ctx =
      ParallelContext::create(dp_layout(world, world, 0, testing::kTestCommTimeoutS));
  constexpr int kLayers = 6;
  constexpr int64_t kC = 32;
  Generator gen(5);
  std::vector<std::pair<std::string, Tensor>> named;
  for (int k = 0; k < kLayers; ++k) {
    Tensor w = randn({kC, kC}, gen, DType::kF32, 0.0, 0.2);
    w.set_requires_grad(true);
    named.emplace_back("l" + std::to_string(k) + ".weight", w);
  }
  DataParallel dp(named, ctx.dp(), dp_config(0, kC * kC * 4));
  ASSERT_EQ(dp.num_buckets(), kLayers);
  const Tensor x = randn({4, kC}, gen, DType::kF32);
  for (int s = 0; s < 3; ++s) {
    SCOPED_TRACE(::testing::Message() << "step " << s);
    dp.zero_grad();
    Tensor h = x;
    for (int k = 0; k < kLayers; ++k) h = marker(ops::gelu(ops::matmul(h, named[k].second)), dp, k);
    autograd::backward(ops::sum_squares(h));
    dp.finish_gradient_sync();
    const DpStepStats& st = dp.last_step_stats();
    const uint64_t first_launch = st.first_seq(DpEventKind::kLaunch);
    int markers_after = 0;
    for (const DpEvent& e : st.events)
      markers_after += e.kind == DpEventKind::kMarker && e.seq > first_launch;
    EXPECT_EQ(st.count(DpEventKind::kMarker), kLayers);
    EXPECT_GE(markers_after, kLayers - 1) << "backward compute left when the first bucket launched";
    EXPECT_EQ(st.count(DpEventKind::kLateLaunch), 0);
    dp.step(testing::kLr);
  }
}

// Note [ZeRO memory formulas] with Ψ parameters in f32: single rank Adam state = 8Ψ bytes;
// ZeRO-1 on N = 4 ranks: 8Ψ/4 per rank, plus at most the bucket padding; over all ranks
// exactly 8Ψ (each parameter element's state lives on exactly one rank). The sharded optimizer
// wraps SGD as it wraps AdamW: with momentum one state tensor per piece, so 4Ψ/4 per rank, and
// the formula follows the inner optimizer.
TEST(DataParallelMemory, Zero1OptimizerStateIsAQuarterOnFourRanks) {
  const int world = testing::world_size();
  if (world % 4 != 0) GTEST_SKIP() << "needs a world size divisible by 4";
  ParallelContext ctx = ParallelContext::create(dp_layout(world, 4, 0, testing::kTestCommTimeoutS));
  const optim::OptimizerFactory sgd =
      [](std::vector<optim::ParamRef> refs) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(std::move(refs), 0.9, 0.0);
  };
  for (const auto& [inner, states] : {std::pair<optim::OptimizerFactory, int64_t>{{}, 2},
                                      std::pair<optim::OptimizerFactory, int64_t>{sgd, 1}}) {
    SCOPED_TRACE(states == 2 ? "AdamW" : "SGD with momentum");
    Transformer model(testing::dp_tiny_gpt());
    Generator gen(testing::kInitSeed);
    model.init_weights(gen);
    const int64_t psi = model.num_parameters();
    DataParallelConfig c = dp_config(1, 16 << 10);
    if (inner) c.optimizer = inner;  // else dp_config's AdamW
    DataParallel zero1(model.named_parameters(), ctx.dp(), c);
    const DpMemory m = zero1.memory();
    const DpMemory f = zero1.memory_formula();
    if (ctx.rank() == 0) std::printf("%s\n", zero1.describe().c_str());
    EXPECT_EQ(zero1.num_parameters(), psi);
    EXPECT_EQ(f.optimizer_bytes, 4 * states * psi / 4);
    const int64_t slack = 4 * states * zero1.num_buckets() * 4 * dp::kShardAlign;  // padding
    EXPECT_LE(m.optimizer_bytes, f.optimizer_bytes + slack);
    EXPECT_GE(m.optimizer_bytes, f.optimizer_bytes - slack);
    Tensor total = Tensor::from_vector<int64_t>({m.optimizer_bytes}, {1});
    ctx.dp().all_reduce(total, ReduceOp::kSum);
    EXPECT_EQ(total.data<int64_t>()[0], 4 * states * psi);
    EXPECT_GE(m.param_bytes, 4 * psi);
    EXPECT_EQ(m.grad_bytes, m.param_bytes);  // ZeRO-1 keeps full gradients
  }
}

TEST(DataParallelMemory, Zero2GradientsAreSharded) {
  const int world = testing::world_size();
  ParallelContext ctx =
      ParallelContext::create(dp_layout(world, world, 0, testing::kTestCommTimeoutS));
  Transformer model(testing::dp_tiny_gpt());
  Generator gen(testing::kInitSeed);
  model.init_weights(gen);
  DataParallel zero2(model.named_parameters(), ctx.dp(), dp_config(2, 16 << 10));
  const DpMemory m = zero2.memory();
  EXPECT_EQ(m.grad_bytes * world, m.param_bytes);
  EXPECT_EQ(m.transient_grad_bytes, m.param_bytes);
}

TEST(DataParallelState, ShardNamesCarryRangesAndCoverEveryElementOnce) {
  const int world = testing::world_size();
  ParallelContext ctx =
      ParallelContext::create(dp_layout(world, world, 0, testing::kTestCommTimeoutS));
  Transformer model(testing::dp_tiny_gpt());
  Generator gen(testing::kInitSeed);
  model.init_weights(gen);
  DataParallel zero1(model.named_parameters(), ctx.dp(), dp_config(1, 16 << 10));
  int64_t exp_avg_numel = 0;
  for (const auto& [name, t] : zero1.state_tensors()) {
    ASSERT_TRUE(name.rfind("exp_avg.", 0) == 0 || name.rfind("exp_avg_sq.", 0) == 0) << name;
    ASSERT_EQ(name.back(), ']') << name;
    if (name.rfind("exp_avg.", 0) == 0) exp_avg_numel += t.numel();
  }
  Tensor total = Tensor::from_vector<int64_t>({exp_avg_numel}, {1});
  ctx.dp().all_reduce(total, ReduceOp::kSum);
  EXPECT_EQ(total.data<int64_t>()[0], model.num_parameters());
}

}  // namespace
}  // namespace loom::parallel
