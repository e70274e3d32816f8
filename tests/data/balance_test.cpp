// tests/data/balance_test.cpp — data/balance.h: the Karmarkar–Karp partition (every sequence in
// exactly one part, the textbook example's difference, deterministic, no worse than greedy
// longest-processing-time on most random long-tailed inputs and never more than one sequence's
// cost from even, the quadratic cost isolating a long sequence) and the micro-batch cut (the
// budget, heaviest first, an over-long sequence alone).
#include "data/balance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"

namespace loom {
namespace {

std::vector<double> part_costs(const std::vector<std::vector<int64_t>>& parts,
                               const std::vector<int64_t>& lengths, const SequenceCost& cost) {
  std::vector<double> out;
  for (const auto& p : parts) {
    double s = 0;
    for (int64_t i : p) s += cost(lengths[static_cast<size_t>(i)]);
    out.push_back(s);
  }
  return out;
}

void expect_each_index_once(const std::vector<std::vector<int64_t>>& parts, size_t n) {
  std::vector<int> seen(n, 0);
  for (const auto& p : parts) {
    for (int64_t i : p) ++seen[static_cast<size_t>(i)];
  }
  EXPECT_EQ(seen, std::vector<int>(n, 1));
}

TEST(Balance, KarmarkarKarpTextbookExample) {
  // {8, 7, 6, 5, 4} into 2: differencing gives 8-7 → 1; 6-5 → 1; 4-1 → 3; 3-1 → 2.
  const std::vector<int64_t> lengths = {8, 7, 6, 5, 4};
  const auto parts = partition_balanced(lengths, 2);
  expect_each_index_once(parts, lengths.size());
  const auto c = part_costs(parts, lengths, {});
  EXPECT_EQ(std::abs(c[0] - c[1]), 2.0);
  EXPECT_EQ(partition_balanced(lengths, 2), parts);  // deterministic
  EXPECT_EQ(partition_balanced({}, 3), std::vector<std::vector<int64_t>>(3));
  EXPECT_EQ(partition_balanced({5}, 3)[0], std::vector<int64_t>{0});
}

TEST(Balance, BeatsGreedyOnLongTailedLengths) {
  std::mt19937 rng(11);
  std::lognormal_distribution<double> len(5.0, 1.0);  // median ~150 tokens, a long tail
  int kk_better_or_equal = 0, trials = 200;
  for (int t = 0; t < trials; ++t) {
    const int parts = 2 + t % 7;
    const size_t n = 1 + rng() % 64;
    std::vector<int64_t> lengths(n);
    for (int64_t& l : lengths) l = std::min<int64_t>(4096, 1 + static_cast<int64_t>(len(rng)));
    const SequenceCost cost{t % 2 ? 1e-3 : 0.0, 1.0};
    const auto kk = partition_balanced(lengths, parts, cost);
    expect_each_index_once(kk, n);
    for (const auto& p : kk) EXPECT_TRUE(std::is_sorted(p.begin(), p.end()));
    // Greedy LPT: heaviest first into the lightest part.
    std::vector<int64_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<int64_t>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
    std::vector<double> greedy(static_cast<size_t>(parts), 0.0);
    for (int64_t i : order)
      *std::min_element(greedy.begin(), greedy.end()) += cost(lengths[static_cast<size_t>(i)]);
    const auto c = part_costs(kk, lengths, cost);
    const double kk_max = *std::max_element(c.begin(), c.end());
    const double kk_min = *std::min_element(c.begin(), c.end());
    double largest = 0;
    for (int64_t l : lengths) largest = std::max(largest, cost(l));
    EXPECT_LE(kk_max - kk_min, largest * (1 + 1e-12)) << "trial " << t;
    if (kk_max <= *std::max_element(greedy.begin(), greedy.end()) * (1 + 1e-12))
      ++kk_better_or_equal;
  }
  EXPECT_GE(kk_better_or_equal, trials * 8 / 10);
}

TEST(Balance, QuadraticCostIsolatesALongSequence) {
  // One 1000-token sequence and ten of 100: by tokens the long one shares a part (1000 + 0 vs
  // 1000 from the ten); by a quadratic cost it is heavier than all ten together.
  std::vector<int64_t> lengths(11, 100);
  lengths[3] = 1000;
  const auto by_cost = partition_balanced(lengths, 2, {1.0, 0.0});
  const auto& with_long = std::find(by_cost[0].begin(), by_cost[0].end(), 3) != by_cost[0].end()
                              ? by_cost[0]
                              : by_cost[1];
  EXPECT_EQ(with_long, std::vector<int64_t>{3});
  const auto by_tokens = partition_balanced(lengths, 2);
  const auto c = part_costs(by_tokens, lengths, {});
  EXPECT_EQ(c[0], c[1]);  // 1000 against 10 × 100
}

TEST(Balance, MicroBatchesRespectTheBudgetHeaviestFirst) {
  const std::vector<int64_t> lengths = {300, 50, 700, 2000, 250, 400, 100};
  const std::vector<int64_t> mine = {0, 1, 2, 3, 4, 5, 6};
  const auto mb = cut_microbatches(mine, lengths, 1000);
  std::vector<int64_t> all;
  for (const auto& b : mb) {
    int64_t tokens = 0;
    for (int64_t i : b) tokens += lengths[static_cast<size_t>(i)];
    EXPECT_TRUE(tokens <= 1000 || b.size() == 1) << tokens;
    all.insert(all.end(), b.begin(), b.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, mine);
  // First-fit decreasing: 2000 alone; 700 + 300; 400 + 250 + 100 + 50.
  EXPECT_EQ(mb, (std::vector<std::vector<int64_t>>{{3}, {2, 0}, {5, 4, 6, 1}}));
  EXPECT_THROW(cut_microbatches(mine, lengths, 0), Error);
  EXPECT_THROW(cut_microbatches({7}, lengths, 10), Error);
}

}  // namespace
}  // namespace loom
