// tests/parallel/gradients_mpi_test.cpp — the global Σ g² from placements (parallel/gradients.h)
// under mpirun on 4 ranks (dp 2 × tp 2, and cp 2 × tp 2 with MiCS-style pieces): every rank
// holds its parts of the same global gradients — a TP-split matrix in three runs (a fused qkv's
// layout), a TP-replicated vector, a ZeRO-style 1-d shard, a tied copy — and the sum must be
// exactly the global tensors' Σ g², each element counted once, on every rank.
// loom-mpi-test: ranks 4
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/ops/view.h"
#include "core/rng.h"
#include "parallel/gradients.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel {
namespace {

double sq(const Tensor& t) {
  double s = 0;
  for (double v : t.to_vector()) s += v * v;
  return s;
}

// A leaf "parameter" holding `values` as its gradient, with a placement.
Tensor with_grad(const Tensor& values, Placement p) {
  Tensor param = Tensor::zeros(values.shape(), DType::kF64);
  param.set_grad(values.contiguous());
  param.set_placement(std::move(p));
  return param;
}

void expect_global_sum(const Axes& data_axes) {
  ParallelOptions o;
  const bool cp = data_axes.front() == kAxisCp;
  o.shape = {.dp = cp ? 1 : 2, .pp = 1, .cp = cp ? 2 : 1, .tp = 2};
  o.comm_timeout_s = testing::kTestCommTimeoutS;
  ParallelContext ctx = ParallelContext::create(o);
  const int tp = ctx.tp_rank();
  const int data = ctx.axis_rank(data_axes.front());
  Generator gen(99);  // the same global gradients on every rank
  const Tensor qkv = randn({12, 3}, gen, DType::kF64);
  const Tensor norm = randn({5}, gen, DType::kF64);
  const Tensor flat = randn({8}, gen, DType::kF64);
  const Tensor wte = randn({4, 2}, gen, DType::kF64);

  // qkv: rows of each of the three segments split over tp, replicated over the data axis.
  Placement pq;
  pq.global_shape = {12, 3};
  pq.splits.push_back({0, kAxisTp, {{0, 2 * tp, 2}, {2, 4 + 2 * tp, 2}, {4, 8 + 2 * tp, 2}}});
  pq.add_replicated(data_axes.front());
  const Tensor qkv_part = ops::cat(
      {qkv.narrow(0, 2 * tp, 2), qkv.narrow(0, 4 + 2 * tp, 2), qkv.narrow(0, 8 + 2 * tp, 2)}, 0);
  // norm: whole on every rank.
  Placement pn;
  pn.global_shape = {5};
  pn.add_replicated(kAxisTp);
  pn.add_replicated(data_axes.front());
  // flat: a ZeRO shard over the data axis (4 elements each), replicated over tp.
  Placement pf;
  pf.global_shape = {4};
  pf.add_replicated(kAxisTp);
  // wte: the tied copy on the "last stage", left out; the primary counted once.
  Placement pw;
  pw.global_shape = {4, 2};
  pw.add_replicated(kAxisTp);
  pw.add_replicated(data_axes.front());
  Placement copy = pw;
  copy.tied_to = "wte.weight";

  const std::vector<Tensor> params = {with_grad(qkv_part, pq), with_grad(norm, pn),
                                      with_grad(flat.narrow(0, 4 * data, 4), pf),
                                      with_grad(wte, pw), with_grad(wte, copy)};
  std::vector<std::pair<std::string, Tensor>> named;
  for (const Tensor& p : params) named.emplace_back("p" + std::to_string(named.size()), p);
  const Tensor got = global_grad_sq_sum(parameter_grad_pieces(named), &ctx, Device::cpu());
  const double want = sq(qkv) + sq(norm) + sq(flat) + sq(wte);
  EXPECT_NEAR(got.item(), want, 1e-12 * want) << ctx.str();
  EXPECT_EQ(got.dim(), 0);
  // Counting on one rank only what it alone holds: the norm only at tp 0 and data 0.
  EXPECT_EQ(counted_here(pn, &ctx), tp == 0 && data == 0);
  EXPECT_TRUE(counted_here(pf, &ctx) == (tp == 0));
  EXPECT_FALSE(counted_here(copy, &ctx));
}

TEST(GlobalGradNorm, EveryElementCountedOnceUnderDpAndTp) {
  if (testing::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  expect_global_sum({kAxisDp});
}

TEST(GlobalGradNorm, EveryElementCountedOnceUnderCpAndTp) {
  if (testing::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  expect_global_sum({kAxisCp});
}

}  // namespace
}  // namespace loom::parallel
