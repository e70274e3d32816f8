// tests/parallel/pp/pp_executor_mpi_test.cpp — the PipelineExecutor alone, under mpirun with
// pp = world size, on a synthetic f64 chain (stage g: y = gelu(x·W_gᵀ) ⊙ x, loss = Σ y / m): for
// every schedule (and odd sizes and micro-batch counts) each stage's weight gradient and the
// loss equal the chain computed in one process, and the executor's peak in-flight activations
// equal the simulator's. Same ops in the same micro-batch order, so the match is exact — also
// for zb-h1, whose BWD computes only the input's gradient (the linear's weight gradient waits
// for its BWD_W: Note [Split backward] in core/autograd.h) and whose hooks' arming comes before
// each BWD_W, and for zb-v, whose V placement puts the loss on rank 0 and hands rank p−1's
// turn from stage p−1 to p over locally (Note [ZB-V] in parallel/pp/schedule.h).
// loom-mpi-test: ranks 2 3 4
#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/ops/activation.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/reduce.h"
#include "core/rng.h"
#include "parallel/pp/executor.h"
#include "parallel/pp/simulate.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel::pp {
namespace {

const Shape kAct = {3, 5};

Tensor weight_of(int g) {
  Generator gen(1000 + static_cast<uint64_t>(g));
  return randn({kAct[1], kAct[1]}, gen, DType::kF64, 0.0, 0.5).set_requires_grad(true);
}

Tensor input_of(int mb) {
  Generator gen(2000 + static_cast<uint64_t>(mb));
  return randn(kAct, gen, DType::kF64);
}

Tensor stage(const Tensor& x, const Tensor& w) {
  return ops::mul(ops::gelu(ops::linear(x, w, Tensor())), x);
}

Tensor micro_loss(const Tensor& y, int m) { return ops::scale(ops::sum(y), 1.0 / m); }

void check(ScheduleKind kind, int v, int m) {
  const int p = testing::world_size();
  SCOPED_TRACE(std::string(schedule_name(kind)) + " v=" + std::to_string(v) +
               " m=" + std::to_string(m));
  ParallelOptions po;
  po.shape.pp = p;
  po.comm_timeout_s = testing::kTestCommTimeoutS;
  ParallelContext ctx = ParallelContext::create(po);
  const ScheduleShape shape = schedule_shape(kind, p, v, m);
  const int S = shape.num_global_stages();

  // Reference: the whole chain in this process.
  std::vector<Tensor> ref_w;
  for (int g = 0; g < S; ++g) ref_w.push_back(weight_of(g));
  double ref_loss = 0;
  for (int mb = 0; mb < m; ++mb) {
    Tensor x = input_of(mb);
    for (int g = 0; g < S; ++g) x = stage(x, ref_w[static_cast<size_t>(g)]);
    Tensor l = micro_loss(x, m);
    ref_loss += l.item();
    autograd::backward(l);
  }

  // Pipelined: this rank's chunks only.
  std::vector<Tensor> w(static_cast<size_t>(v));
  for (int c = 0; c < v; ++c)
    w[static_cast<size_t>(c)] = weight_of(shape.global_stage(ctx.pp_rank(), c));
  ChunkCallbacks cb;
  cb.forward = [&](int mb, int chunk, const Tensor& input) {
    const int g = shape.global_stage(ctx.pp_rank(), chunk);
    Tensor y = stage(g == 0 ? input_of(mb) : input, w[static_cast<size_t>(chunk)]);
    return g == S - 1 ? micro_loss(y, m) : y;
  };
  int backwards = 0, last_flags = 0;
  cb.before_backward = [&](bool last) {
    ++backwards;
    last_flags += last ? 1 : 0;
  };
  PipelineExecutor ex(ctx.pp(), kind, shape, kAct, DType::kF64);
  const PipelineStats st = ex.run(cb);

  EXPECT_EQ(backwards, v * m);
  EXPECT_EQ(last_flags, 1);
  for (int c = 0; c < v; ++c) {
    const int g = shape.global_stage(ctx.pp_rank(), c);
    ASSERT_TRUE(w[static_cast<size_t>(c)].grad().defined()) << "stage " << g;
    EXPECT_EQ(w[static_cast<size_t>(c)].grad().to_vector(),
              ref_w[static_cast<size_t>(g)].grad().to_vector())
        << "stage " << g;
  }
  if (ctx.pp_rank() == shape.stage_rank(S - 1)) {
    ASSERT_TRUE(st.loss_sum.defined());
    EXPECT_EQ(st.loss_sum.item(), ref_loss);
  } else {
    EXPECT_FALSE(st.loss_sum.defined());
  }
  std::vector<std::vector<Instruction>> lists;
  for (int r = 0; r < p; ++r) lists.push_back(make_schedule(kind, shape, r));
  const SimulationResult sim = simulate(shape, lists);
  ASSERT_TRUE(sim.ok) << sim.error;
  EXPECT_EQ(st.peak_in_flight, sim.peak_in_flight[static_cast<size_t>(ctx.pp_rank())]);
  EXPECT_GT(st.compute_s, 0.0);
  EXPECT_GE(st.total_s, st.compute_s);
  // The waits are inside the step and apart from compute; the bubble is the simulator's, which
  // for GPipe and 1F1B is (p−1)/(m+p−1) on every rank (Note [Pipeline cost model]).
  EXPECT_LE(st.compute_s + st.recv_wait_s + st.send_wait_s, st.total_s);
  EXPECT_EQ(st.schedule_bubble, sim.bubble_fraction(ctx.pp_rank()));
  if (kind == ScheduleKind::kGpipe || kind == ScheduleKind::k1F1B) {
    EXPECT_DOUBLE_EQ(st.schedule_bubble, (p - 1.0) / (m + p - 1.0));
  }
  EXPECT_DOUBLE_EQ(st.schedule_bubble_s(),
                   st.compute_s * st.schedule_bubble / (1 - st.schedule_bubble));
  ctx.world().barrier();
}

TEST(PipelineExecutor, GpipeMatchesOneProcess) {
  check(ScheduleKind::kGpipe, 1, 3);
  check(ScheduleKind::kGpipe, 1, 1);
}

TEST(PipelineExecutor, OneFOneBMatchesOneProcess) {
  const int p = testing::world_size();
  check(ScheduleKind::k1F1B, 1, p + 1);
  check(ScheduleKind::k1F1B, 1, 1);  // fewer micro-batches than stages
}

TEST(PipelineExecutor, ZeroBubbleH1MatchesOneProcess) {
  const int p = testing::world_size();
  check(ScheduleKind::kZeroBubbleH1, 1, 2 * p + 1);
  check(ScheduleKind::kZeroBubbleH1, 1, 1);  // fewer micro-batches than stages
}

TEST(PipelineExecutor, ZeroBubbleVMatchesOneProcess) {
  const int p = testing::world_size();
  check(ScheduleKind::kZeroBubbleV, 2, 2 * p + 1);
  check(ScheduleKind::kZeroBubbleV, 2, p);
  check(ScheduleKind::kZeroBubbleV, 2, 1);  // fewer micro-batches than stages
}

TEST(PipelineExecutor, InterleavedMatchesOneProcess) {
  const int p = testing::world_size();
  check(ScheduleKind::kInterleaved, 2, 2 * p);
  check(ScheduleKind::kInterleaved, 3, p);
}

}  // namespace
}  // namespace loom::parallel::pp
