// tests/kernels/vocab_parallel_kernel_test.cpp — the CPU kernels that keep the vocab-parallel
// loss and embedding on the device (kernels/cross_entropy.h vocab_parallel_lse_combine,
// kernels/embedding.h vocab_parallel_ids): the combine against the arithmetic of the former host
// loop in parallel/tp/cross_entropy.cpp (bit for bit, f32 and f64 statistics); the per-rank
// forward plus the combine against the single-process cross_entropy_forward on the gathered
// logits (1e-12, f64); ignored rows, no counted row, a bad target; and the shard ids and mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/ops/view.h"
#include "core/rng.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"

namespace loom {
namespace {

struct Combined {
  Tensor lse, row_loss, loss, inv_count;
};

Combined combine(const Tensor& lses, const Tensor& tl, const Tensor& targets, int64_t ignore,
                 int64_t vocab) {
  const int64_t n = lses.size(1);
  Combined c{Tensor::full({n}, NAN, lses.dtype()), Tensor::full({n}, NAN, DType::kF64),
             Tensor::full({}, NAN, lses.dtype()), Tensor::full({}, NAN, DType::kF64)};
  kernels::call_kernel<kernels::vocab_parallel_lse_combine_k>(
      lses, tl, targets, ignore, vocab, c.lse, c.row_loss, c.loss, c.inv_count);
  return c;
}

// Targets in [0, vocab) with about a third ignored (row 0 always counts).
std::vector<int64_t> draw_targets(int64_t n, int64_t vocab, int64_t ignore, std::mt19937_64& rng) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    const bool ignored = r > 0 && rng() % 3 == 0;
    t[static_cast<size_t>(r)] =
        ignored ? ignore : static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
  }
  return t;
}

TEST(VocabParallelLseCombine, MatchesTheFormerHostLoopBitForBit) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Generator gen(seed);
  for (DType dt : {DType::kF32, DType::kF64}) {
    for (int64_t g : {1, 2, 3, 8}) {
      const int64_t n = 37, vocab = 1000, ignore = -100;
      const Tensor lses = randn({g, n}, gen, dt, 2.0, 5.0);
      const Tensor tl = randn({n}, gen, dt, 0.0, 3.0);
      const std::vector<int64_t> t = draw_targets(n, vocab, ignore, rng);
      const Combined c = combine(lses, tl, Tensor::from_vector(t, {n}), ignore, vocab);
      // The former host loop (parallel/tp/cross_entropy.cpp before the kernel).
      const std::vector<double> ls = lses.to_vector(), tls = tl.to_vector();
      std::vector<double> lse(static_cast<size_t>(n), 0.0), rl(static_cast<size_t>(n), 0.0);
      double total = 0.0;
      int64_t count = 0;
      for (int64_t r = 0; r < n; ++r) {
        if (t[static_cast<size_t>(r)] == ignore) continue;
        double m = -INFINITY;
        for (int64_t q = 0; q < g; ++q) m = std::max(m, ls[static_cast<size_t>(q * n + r)]);
        double s = 0.0;
        for (int64_t q = 0; q < g; ++q) s += std::exp(ls[static_cast<size_t>(q * n + r)] - m);
        lse[static_cast<size_t>(r)] = m + std::log(s);
        rl[static_cast<size_t>(r)] = lse[static_cast<size_t>(r)] - tls[static_cast<size_t>(r)];
        total += rl[static_cast<size_t>(r)];
        ++count;
      }
      const std::string what = std::string(dtype_name(dt)) + " g " + std::to_string(g);
      EXPECT_EQ(c.lse.to_vector(), Tensor::from_vector(lse, {n}).to(dt).to_vector()) << what;
      EXPECT_EQ(c.row_loss.to_vector(), rl) << what;
      EXPECT_EQ(c.loss.item(), Tensor::full({}, total / static_cast<double>(count), dt).item())
          << what;
      EXPECT_EQ(c.inv_count.item(), 1.0 / static_cast<double>(count)) << what;
    }
  }
}

TEST(VocabParallelLseCombine, ShardsThenCombineEqualTheGatheredCrossEntropy) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Generator gen(seed);
  const int64_t g = 3, vl = 41, vp = g * vl, vocab = vp - 7, n = 29, ignore = -1;
  const Tensor logits = randn({n, vp}, gen, DType::kF64, 0.0, 4.0);
  const std::vector<int64_t> tv = draw_targets(n, vocab, ignore, rng);
  const Tensor targets = Tensor::from_vector(tv, {n}).to(DType::kI32);
  Tensor lses = Tensor::empty({g, n}, DType::kF64), tl = Tensor::zeros({n}, DType::kF64);
  for (int64_t q = 0; q < g; ++q) {
    const int64_t start = q * vl, valid = std::min(vl, vocab - start);
    const Tensor x = ops::contiguous(logits.narrow(1, start, vl));
    Tensor l = Tensor::empty({n}, DType::kF64), t = Tensor::empty({n}, DType::kF64);
    kernels::call_kernel<kernels::vocab_parallel_ce_forward_k>(x, targets, ignore, start, valid, l,
                                                               t);
    Tensor row = lses.narrow(0, q, 1).view({n});
    ops::copy_(row, l);
    const std::vector<double> a = tl.to_vector(), b = t.to_vector();
    std::vector<double> s(a.size());
    for (size_t i = 0; i < a.size(); ++i) s[i] = a[i] + b[i];
    tl = Tensor::from_vector(s, {n});
  }
  const Combined c = combine(lses, tl, targets, ignore, vocab);
  Tensor want_loss = Tensor::empty({n}, DType::kF64), want_lse = Tensor::empty({n}, DType::kF64);
  kernels::call_kernel<kernels::cross_entropy_forward_k>(logits, targets, ignore, vocab, want_loss,
                                                         want_lse);
  const std::vector<double> wl = want_lse.to_vector(), gl = c.lse.to_vector();
  const std::vector<double> wr = want_loss.to_vector(), gr = c.row_loss.to_vector();
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r) {
    const auto i = static_cast<size_t>(r);
    EXPECT_NEAR(gl[i], wl[i], 1e-12 * std::abs(wl[i]) + 1e-300) << "lse row " << r;
    EXPECT_NEAR(gr[i], wr[i], 1e-12 * (std::abs(wl[i]) + std::abs(wr[i]))) << "loss row " << r;
    if (tv[i] != ignore) {
      sum += wr[i];
      ++count;
    } else {
      EXPECT_EQ(gl[i], 0.0) << "ignored row " << r;
      EXPECT_EQ(gr[i], 0.0) << "ignored row " << r;
    }
  }
  EXPECT_NEAR(c.loss.item(), sum / static_cast<double>(count), 1e-12 * std::abs(sum));
}

TEST(VocabParallelLseCombine, NoCountedRowGivesZeroLossAndScale) {
  Generator gen(3);
  const int64_t n = 5;
  const Combined c = combine(randn({2, n}, gen, DType::kF32), randn({n}, gen, DType::kF32),
                             Tensor::full({n}, -100, DType::kI64), -100, 10);
  EXPECT_EQ(c.loss.item(), 0.0);
  EXPECT_EQ(c.inv_count.item(), 0.0);
  EXPECT_EQ(c.lse.to_vector(), std::vector<double>(n, 0.0));
  EXPECT_EQ(c.row_loss.to_vector(), std::vector<double>(n, 0.0));
  // No rows at all.
  const Combined e = combine(Tensor::empty({2, 0}, DType::kF64), Tensor::empty({0}, DType::kF64),
                             Tensor::empty({0}, DType::kI64), -100, 10);
  EXPECT_EQ(e.loss.item(), 0.0);
  EXPECT_EQ(e.inv_count.item(), 0.0);
}

TEST(VocabParallelLseCombine, RejectsATargetOutsideTheVocabulary) {
  Generator gen(4);
  const Tensor targets = Tensor::from_vector<int64_t>({1, -100, 10}, {3});
  try {
    combine(randn({2, 3}, gen, DType::kF64), randn({3}, gen, DType::kF64), targets, -100, 10);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("target 10 at row 2"), std::string::npos) << e.what();
  }
}

TEST(VocabParallelIds, LocalIdsAndMaskOfTheShard) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t rows = 13, start = 26, n = 3 * 7;  // ids of three shards of 13 rows
  for (DType idt : {DType::kI32, DType::kI64, DType::kU16, DType::kU32}) {
    for (DType mdt : {DType::kF32, DType::kF64}) {
      std::vector<int64_t> ids(static_cast<size_t>(n));
      for (auto& id : ids) id = static_cast<int64_t>(rng() % 39);
      ids[0] = start;  // both edges of the shard and one past it
      ids[1] = start + rows - 1;
      ids[2] = start + rows;
      ids[3] = start - 1;
      Tensor local = Tensor::full({3, 7}, 77, DType::kI64),
             mask = Tensor::full({3, 7, 1}, NAN, mdt);
      kernels::call_kernel<kernels::vocab_parallel_ids_k>(Tensor::from_vector(ids, {3, 7}).to(idt),
                                                          start, rows, local, mask);
      const std::vector<double> l = local.to_vector(), m = mask.to_vector();
      for (size_t i = 0; i < ids.size(); ++i) {
        const bool mine = ids[i] >= start && ids[i] < start + rows;
        EXPECT_EQ(l[i], mine ? static_cast<double>(ids[i] - start) : 0.0) << "id " << ids[i];
        EXPECT_EQ(m[i], mine ? 1.0 : 0.0) << "id " << ids[i];
      }
    }
  }
}

}  // namespace
}  // namespace loom
