// tests/parallel/dp/dp_zero3_mpi_test.cpp — ZeRO-3 mechanics (Note [ZeRO-3] in
// parallel/dp/data_parallel.h): prefetch and reduce-scatter overlap proven from the engine's own
// event log (no timing), per-micro-batch reductions under accumulation, parameters really
// released between uses, per-rank memory from the allocator's statistics against a quarter of
// the single-rank bytes on 4 ranks, and the errors of a wrong set-up. Equivalence with the
// single process is in dp_equivalence_mpi_test.cpp.
// loom-mpi-test: ranks 2 4
// loom-multihost-test: 2x2
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "core/allocator.h"
#include "parallel/dp/bucket.h"
#include "tests/parallel/dp/dp_test_util.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel {
namespace {

using testing::dp_config;
using testing::dp_layout;

constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();

// seq of the first event of `kind` about `unit` with seq >= from (kNone when none).
uint64_t find(const DpStepStats& st, DpEventKind kind, int unit, uint64_t from = 0) {
  for (const DpEvent& e : st.events) {
    if (e.kind == kind && e.bucket == unit && e.seq >= from) return e.seq;
  }
  return kNone;
}

int count(const DpStepStats& st, DpEventKind kind, int unit) {
  int n = 0;
  for (const DpEvent& e : st.events) n += e.kind == kind && e.bucket == unit;
  return n;
}

// Trains the tiny GPT (units: 0 embeddings, 1-2 blocks, 3 final norm; tied head) for 3 steps
// of `micro` micro-batches on dp = world, checking every step's log.
void check_zero3_overlap(int micro) {
  const int world = testing::world_size();
  ParallelContext ctx =
      ParallelContext::create(dp_layout(world, world, 0, testing::kTestCommTimeoutS));
  Transformer model(testing::dp_tiny_gpt());
  Generator gen(testing::kInitSeed);
  model.init_weights(gen);
  auto engine = testing::make_dp(model, ctx.dp(), dp_config(3, 0));
  DataParallel& dp = *engine;
  const int units = dp.num_buckets();
  const int head = units - 1;
  ASSERT_EQ(units, static_cast<int>(model.num_blocks()) + 2);
  for (int s = 0; s < 3; ++s) {
    SCOPED_TRACE(::testing::Message() << "step " << s);
    auto [ids, targets] = testing::global_batch(s);
    dp.zero_grad();
    for (int m = 0; m < micro; ++m) {
      dp.set_sync(m == micro - 1);
      Tensor loss =
          model.loss(ids.narrow(0, m, 1).contiguous(), targets.narrow(0, m, 1).contiguous());
      autograd::backward(ops::scale(loss, 1.0 / micro));
      EXPECT_EQ(dp.gathered_bytes(), 0) << "every unit is released once its backward is done";
    }
    dp.finish_gradient_sync();
    const DpStepStats& st = dp.last_step_stats();
    // Forward: while unit u computes (between its begin and end events), the gather of unit
    // u + 1 has been issued ahead of use.
    for (int u = 0; u + 1 < units; ++u) {
      const uint64_t begin = find(st, DpEventKind::kUnitForward, u);
      const uint64_t end = find(st, DpEventKind::kUnitForwardEnd, u, begin);
      const uint64_t prefetch = find(st, DpEventKind::kPrefetch, u + 1, begin);
      ASSERT_NE(begin, kNone) << "unit " << u;
      EXPECT_LT(prefetch, end) << "unit " << u + 1 << " not prefetched during unit " << u;
    }
    // Backward (reverse unit order): entering unit u's backward prefetches unit u - 1 before
    // any of u's gradients is ready; unit 0 is still gathered by the tied head, so block 1 has
    // nothing to prefetch.
    for (int u = head; u >= 2; --u) {
      const uint64_t begin = find(st, DpEventKind::kUnitBackward, u);
      const uint64_t prefetch = find(st, DpEventKind::kPrefetch, u - 1, begin);
      const uint64_t first_hook = find(st, DpEventKind::kHook, u, begin);
      ASSERT_NE(begin, kNone) << "unit " << u;
      EXPECT_LT(prefetch, first_hook) << "unit " << u - 1 << " not prefetched in backward";
    }
    // Reduce-scatters: one per unit per micro-batch, all from the hooks, the first while the
    // embeddings' backward (the last unit of backward) had not even begun.
    EXPECT_EQ(st.count(DpEventKind::kLaunch), units * micro);
    EXPECT_EQ(st.count(DpEventKind::kLateLaunch), 0);
    uint64_t last_unit_backward = 0;
    for (const DpEvent& e : st.events) {
      if (e.kind == DpEventKind::kUnitBackward && e.bucket == 0) last_unit_backward = e.seq;
    }
    EXPECT_LT(st.first_seq(DpEventKind::kLaunch), last_unit_backward);
    EXPECT_LT(find(st, DpEventKind::kLaunch, head), find(st, DpEventKind::kUnitBackward, 1));
    EXPECT_EQ(st.launched_early_bytes, st.grad_bytes);
    // Every gather is matched by a release: forward releases each unit after use (unit 0
    // twice: the embeddings and the tied head), backward after its gradients.
    for (int u = 0; u < units; ++u) {
      EXPECT_EQ(count(st, DpEventKind::kRelease, u),
                count(st, DpEventKind::kGather, u) + count(st, DpEventKind::kPrefetch, u))
          << "unit " << u;
      EXPECT_EQ(count(st, DpEventKind::kUnitForward, u), micro * (u == 0 ? 2 : 1));
    }
    testing::clip_and_step(dp, ctx, testing::kLr);
    EXPECT_EQ(dp.gathered_bytes(), 0);
    EXPECT_ANY_THROW(model.wte_weight().to_vector()) << "a released parameter must not be readable";
  }
  model.set_unit_hooks(nullptr);
}

TEST(DataParallelZero3, PrefetchAndReduceScatterOverlapCompute) { check_zero3_overlap(1); }
TEST(DataParallelZero3, AccumulationReduceScattersEveryMicroBatch) { check_zero3_overlap(2); }

// Overlap off (for measuring) keeps the unit gradients and reduce-scatters them once in
// finish_gradient_sync; one micro-batch gives the same reductions, so the same parameters.
TEST(DataParallelZero3, OverlapOffReducesAfterBackwardToTheSameResult) {
  const int world = testing::world_size();
  ParallelContext ctx =
      ParallelContext::create(dp_layout(world, world, 0, testing::kTestCommTimeoutS));
  std::vector<NamedTensors> params;
  for (bool overlap : {true, false}) {
    DataParallelConfig cfg = dp_config(3, 0);
    cfg.overlap = overlap;
    const testing::RunResult r = testing::dp_run(ctx, cfg, false, 2, 1);
    params.push_back(r.params);
  }
  ASSERT_EQ(params[0].size(), params[1].size());
  for (size_t i = 0; i < params[0].size(); ++i) {
    EXPECT_EQ(params[0][i].second.to_vector(), params[1][i].second.to_vector())
        << params[0][i].first;
  }
}

TEST(DataParallelZero3, NeedsParameterUnits) {
  const int world = testing::world_size();
  ParallelContext ctx =
      ParallelContext::create(dp_layout(world, world, 0, testing::kTestCommTimeoutS));
  Transformer model(testing::dp_tiny_gpt());
  try {
    DataParallel dp(model.named_parameters(), ctx.dp(), dp_config(3, 1 << 20));
    FAIL() << "ZeRO-3 from a flat parameter list must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter units"), std::string::npos) << e.what();
  }
}

// Records the allocator's bytes and the engine's gathered bytes at every unit's forward.
class RecordingHooks final : public UnitHooks {
 public:
  explicit RecordingHooks(DataParallel& dp) : dp_(dp) {}
  void before_forward(int unit) override {
    dp_.unit_hooks()->before_forward(unit);
    samples.push_back(
        {allocator_for(DeviceType::kCpu).stats().current_bytes, dp_.gathered_bytes()});
  }
  Tensor after_forward(int unit, const Tensor& out) override {
    return dp_.unit_hooks()->after_forward(unit, out);
  }
  std::vector<std::pair<int64_t, int64_t>> samples;  // (allocator bytes, gathered bytes)

 private:
  DataParallel& dp_;
};

ModelConfig memory_gpt() {  // large enough that parameters dwarf activations and allocator noise
  ModelConfig c = testing::dp_tiny_gpt();
  c.n_embd = 128;
  c.n_layer = 4;
  c.n_head = 4;
  return c;
}

// Note [ZeRO-3 memory check]: S = the single-rank bytes (model parameters, gradients and AdamW
// state after one step, measured with the allocator: ≈ 16Ψ). On 4 ranks, between steps, a
// ZeRO-3 rank holds (measured the same way) P ≤ S/4 + 16·pad/4 + 64 KiB, where pad is the
// padding elements over all units (each padded element costs a parameter, gradient and two
// AdamW floats, split over 4 ranks) and 64 KiB covers small allocations; no unit is gathered
// then. During a forward, the allocator's bytes above P are at most the gathered units (the
// engine's own count, which is at most two units: the one in use and the prefetched one, or
// three with the tied embeddings at the head) plus 256 KiB of activations (B 2, T 16).
TEST(DataParallelZero3Memory, PersistentBytesAreAQuarterOnFourRanks) {
  const int world = testing::world_size();
  if (world % 4 != 0) GTEST_SKIP() << "needs a world size divisible by 4";
  ParallelContext ctx = ParallelContext::create(dp_layout(world, 4, 0, testing::kTestCommTimeoutS));
  Allocator& alloc = allocator_for(DeviceType::kCpu);
  auto [ids_all, targets_all] = testing::global_batch(0);
  const Tensor ids = ids_all.narrow(0, 2 * ctx.dp_rank(), 2).contiguous();
  const Tensor targets = targets_all.narrow(0, 2 * ctx.dp_rank(), 2).contiguous();
  const DataParallelConfig cfg = dp_config(3, 0);

  int64_t single = 0, psi = 0;
  {
    const int64_t base = alloc.stats().current_bytes;
    Transformer model(memory_gpt());
    Generator gen(testing::kInitSeed);
    model.init_weights(gen);
    psi = model.num_parameters();
    auto opt =
        testing::make_adamw(optim::make_param_refs(model.named_parameters(), cfg.decay_rule));
    autograd::backward(model.loss(ids, targets));
    opt->step(testing::kLr);
    single = alloc.stats().current_bytes - base;
  }
  int64_t persistent = 0, pad = 0, largest_unit = 0, unit0 = 0, base = 0;
  std::vector<std::pair<int64_t, int64_t>> samples;
  DpMemory m;
  {
    base = alloc.stats().current_bytes;
    Transformer model(memory_gpt());
    Generator gen(testing::kInitSeed);
    model.init_weights(gen);
    const auto units = model.parameter_units();
    DataParallel dp(units, ctx.dp(), cfg);
    RecordingHooks hooks(dp);
    model.set_unit_hooks(&hooks);
    for (const NamedTensors& unit : units) {
      int64_t n = 0;
      for (const auto& [name, p] : unit) n += p.numel();
      const int64_t padded =
          (n + 4 * dp::kShardAlign - 1) / (4 * dp::kShardAlign) * (4 * dp::kShardAlign);
      pad += padded - n;
      largest_unit = std::max(largest_unit, 4 * padded);
      if (unit0 == 0) unit0 = 4 * padded;
    }
    for (int s = 0; s < 2; ++s) {
      dp.zero_grad();
      autograd::backward(model.loss(ids, targets));
      dp.finish_gradient_sync();
      testing::clip_and_step(dp, ctx, testing::kLr);
    }
    EXPECT_EQ(dp.gathered_bytes(), 0);
    persistent = alloc.stats().current_bytes - base;
    m = dp.memory();
    hooks.samples.clear();
    {
      autograd::NoGradGuard no_grad;
      model.loss(ids, targets);
    }
    samples = hooks.samples;
    if (ctx.rank() == 0) std::printf("%s\n", dp.describe().c_str());
    model.set_unit_hooks(nullptr);
  }
  const int64_t bound = single / 4 + 16 * pad / 4 + (64 << 10);
  if (ctx.rank() == 0) {
    std::printf(
        "psi %lld: single-rank %lld B, ZeRO-3 rank %lld B (bound %lld), peak gathered %lld B\n",
        static_cast<long long>(psi), static_cast<long long>(single),
        static_cast<long long>(persistent), static_cast<long long>(bound),
        static_cast<long long>(m.transient_param_bytes));
  }
  EXPECT_GE(single, 16 * psi);
  EXPECT_LE(persistent, bound);
  EXPECT_GE(persistent, 16 * psi / 4);  // the shards are really held
  EXPECT_EQ(m.param_bytes, 4 * (psi + pad) / 4);
  EXPECT_EQ(m.grad_bytes, 4 * (psi + pad) / 4);
  // The most gathered at once over the training steps (engine's count): two units, or three
  // with the tied embeddings held by the head's backward.
  EXPECT_GT(m.transient_param_bytes, 0);
  EXPECT_LE(m.transient_param_bytes, unit0 + 2 * largest_unit);
  ASSERT_EQ(samples.size(), static_cast<size_t>(memory_gpt().n_layer + 3));
  for (const auto& [bytes, gathered] : samples) {
    EXPECT_LE(gathered, unit0 + 2 * largest_unit);
    EXPECT_LE(bytes - base, persistent + gathered + (256 << 10))
        << "more than the gathered units alive";
  }
}

}  // namespace
}  // namespace loom::parallel
