// tests/parallel/sdp/assignment_test.cpp — the SDP covers (parallel/sdp/assignment.h) in one
// process: over many (workers, coverage, sizes), every unit and every block is held by exactly
// k = C·N workers, each worker holds ⌊k·U/N⌋ or ⌈k·U/N⌉ units of a layer (exactly C·n_layer
// blocks), slices are contiguous and even, the holder sets are the cyclic windows, the layout is
// a function of the seed that changes with it, the holder graph is connected exactly when a
// connected cover exists (checked here by a search of the test's own), and every configuration
// error names its keys.
#include "parallel/sdp/assignment.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "core/error.h"

namespace loom::parallel::sdp {
namespace {

// Expects `f` to throw ConfigError whose message contains every one of `keys`.
void expect_config_error(const std::function<void()>& f, const std::vector<std::string>& keys) {
  try {
    f();
    ADD_FAILURE() << "no ConfigError (expected one naming " << keys.front() << ")";
  } catch (const ConfigError& e) {
    for (const auto& key : keys)
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos)
          << "'" << e.what() << "' does not name " << key;
  }
}

// The test's own connectivity search (breadth first over workers sharing a set).
bool connected(int workers, const std::vector<std::vector<int>>& sets) {
  std::vector<bool> seen(workers, false);
  std::vector<int> todo = {0};
  seen[0] = true;
  while (!todo.empty()) {
    const int w = todo.back();
    todo.pop_back();
    for (const auto& set : sets) {
      if (std::find(set.begin(), set.end(), w) == set.end()) continue;
      for (int v : set)
        if (!seen[v]) {
          seen[v] = true;
          todo.push_back(v);
        }
    }
  }
  return std::all_of(seen.begin(), seen.end(), [](bool b) { return b; });
}

// The N cyclic windows {j, …, j+k−1} mod N as sorted sets, without repeats.
std::set<std::vector<int>> cyclic_windows(int n, int k) {
  std::set<std::vector<int>> out;
  for (int j = 0; j < n; ++j) {
    std::vector<int> w;
    for (int i = 0; i < k; ++i) w.push_back((j + i) % n);
    std::sort(w.begin(), w.end());
    out.insert(w);
  }
  return out;
}

struct Case {
  int workers;
  int k;
};

// Every (N, k) with 1 <= N <= 12 and a connected cover at the neuron level (k >= 2, or N = 1).
std::vector<Case> neuron_cases() {
  std::vector<Case> out;
  for (int n = 1; n <= 12; ++n)
    for (int k = (n == 1 ? 1 : 2); k <= n; ++k) out.push_back({n, k});
  return out;
}

CoverOptions options(int workers, int k, uint64_t seed = 7) {
  return {workers, static_cast<double>(k) / workers, seed};
}

TEST(SdpAssignment, NeuronCoverHoldsEveryUnitExactlyKTimesInBalance) {
  for (const Case& c : neuron_cases()) {
    const int n = c.workers, k = c.k;
    const std::vector<int64_t> units = {n, n + 1, 2 * n - 1, 37 + n, 3 * n + 5, 1024};
    SCOPED_TRACE("N=" + std::to_string(n) + " k=" + std::to_string(k));
    const NeuronAssignment a = assign_neurons(options(n, k), units);
    EXPECT_EQ(a.replication, k);
    ASSERT_EQ(a.layers.size(), units.size());
    for (size_t l = 0; l < units.size(); ++l) {
      const LayerCover& cover = a.layers[l];
      const int64_t u = units[l];
      ASSERT_EQ(static_cast<int>(cover.slices.size()), n);
      // Slices: contiguous, in order, covering [0, u), each of size ⌊u/N⌋ or ⌈u/N⌉, with k
      // distinct ascending holders.
      int64_t next = 0;
      for (const UnitSlice& s : cover.slices) {
        EXPECT_EQ(s.begin, next);
        EXPECT_TRUE(s.size() == u / n || s.size() == (u + n - 1) / n) << s.size();
        next = s.end;
        ASSERT_EQ(static_cast<int>(s.holders.size()), k);
        EXPECT_TRUE(std::is_sorted(s.holders.begin(), s.holders.end()));
        EXPECT_EQ(std::set<int>(s.holders.begin(), s.holders.end()).size(), s.holders.size());
        for (int h : s.holders) EXPECT_TRUE(h >= 0 && h < n);
      }
      EXPECT_EQ(next, u);
      // Each unit counted over the workers' owned lists: exactly k; each worker in balance.
      std::vector<int> count(u, 0);
      for (int w = 0; w < n; ++w) {
        const std::vector<int64_t> owned = cover.owned_units(w);
        EXPECT_TRUE(std::is_sorted(owned.begin(), owned.end()));
        EXPECT_EQ(std::set<int64_t>(owned.begin(), owned.end()).size(), owned.size());
        const int64_t lo = k * u / n, hi = (k * u + n - 1) / n;
        EXPECT_TRUE(static_cast<int64_t>(owned.size()) == lo ||
                    static_cast<int64_t>(owned.size()) == hi)
            << "worker " << w << " holds " << owned.size() << " of " << u;
        EXPECT_EQ(cover.owned_count(w), static_cast<int64_t>(owned.size()));
        EXPECT_EQ(cover.slices_of(w).size(), static_cast<size_t>(k));
        // The ranges: at most two, and exactly the owned units.
        const auto ranges = cover.owned_ranges(w);
        EXPECT_LE(ranges.size(), 2u);
        std::vector<int64_t> from_ranges;
        for (const auto& [b, e] : ranges)
          for (int64_t x = b; x < e; ++x) from_ranges.push_back(x);
        EXPECT_EQ(from_ranges, owned);
        // Ownership agrees with the slices' holder lists.
        for (int64_t x : owned) {
          const auto s = std::find_if(cover.slices.begin(), cover.slices.end(),
                                      [&](const UnitSlice& sl) { return x < sl.end; });
          ASSERT_NE(s, cover.slices.end());
          EXPECT_TRUE(std::binary_search(s->holders.begin(), s->holders.end(), w));
        }
        for (int64_t x : owned) ++count[x];
      }
      for (int64_t x = 0; x < u; ++x) ASSERT_EQ(count[x], k) << "unit " << x;
    }
  }
}

TEST(SdpAssignment, SliceBoundariesSpreadTheRemainder) {
  // 10 units over 4 workers: ⌊s·10/4⌋ = 0, 2, 5, 7, 10 (worked by hand).
  const NeuronAssignment a = assign_neurons(options(4, 2), {10});
  const std::vector<std::pair<int64_t, int64_t>> expect = {{0, 2}, {2, 5}, {5, 7}, {7, 10}};
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(a.layers[0].slices[s].begin, expect[s].first);
    EXPECT_EQ(a.layers[0].slices[s].end, expect[s].second);
  }
  // Any two cyclically consecutive slices hold 5 units: every worker holds exactly 5.
  for (int w = 0; w < 4; ++w) EXPECT_EQ(a.layers[0].owned_count(w), 5);
}

TEST(SdpAssignment, FullCoverageHoldsEverything) {
  for (int n : {1, 2, 5, 8}) {
    const NeuronAssignment a = assign_neurons({n, 1.0, 3}, {16, 33});
    EXPECT_EQ(a.replication, n);
    for (int w = 0; w < n; ++w)
      for (int l = 0; l < 2; ++l) {
        std::vector<int64_t> all(a.layers[l].units);
        for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
        EXPECT_EQ(a.owned_units(w, l), all);
      }
    ASSERT_EQ(a.holder_sets().size(), 1u);
    EXPECT_EQ(static_cast<int>(a.holder_sets()[0].size()), n);
  }
}

TEST(SdpAssignment, HolderSetsAreTheCyclicWindows) {
  for (const Case& c : neuron_cases()) {
    const int n = c.workers, k = c.k;
    const NeuronAssignment a = assign_neurons(options(n, k, 11), {n, 2 * n + 3, 5 * n});
    const auto sets = a.holder_sets();
    // The distinct holder lists of the slices, gathered here, are the sets returned.
    std::set<std::vector<int>> seen;
    for (const LayerCover& cover : a.layers)
      for (const UnitSlice& s : cover.slices) seen.insert(s.holders);
    EXPECT_EQ(std::set<std::vector<int>>(sets.begin(), sets.end()), seen);
    EXPECT_TRUE(std::is_sorted(sets.begin(), sets.end()));
    // They are the N cyclic windows of consecutive workers (one set when k = N), and each
    // worker belongs to k of them (all of one when k = N).
    EXPECT_EQ(seen, cyclic_windows(n, k)) << "N=" << n << " k=" << k;
    for (int w = 0; w < n; ++w) {
      const auto in = std::count_if(sets.begin(), sets.end(), [&](const std::vector<int>& s) {
        return std::binary_search(s.begin(), s.end(), w);
      });
      EXPECT_EQ(in, k < n ? k : 1);
    }
    EXPECT_TRUE(connected(n, sets));
  }
}

TEST(SdpAssignment, SeedDeterminesTheLayout) {
  const std::vector<int64_t> units(12, 96);
  const NeuronAssignment a = assign_neurons({8, 0.5, 1234}, units);
  const NeuronAssignment b = assign_neurons({8, 0.5, 1234}, units);
  const NeuronAssignment c = assign_neurons({8, 0.5, 1235}, units);
  bool seed_changes = false;
  std::set<std::vector<int64_t>> layouts_of_worker0;
  for (int l = 0; l < 12; ++l) {
    for (int w = 0; w < 8; ++w) {
      EXPECT_EQ(a.owned_units(w, l), b.owned_units(w, l));
      if (a.owned_units(w, l) != c.owned_units(w, l)) seed_changes = true;
    }
    for (int s = 0; s < 8; ++s)
      EXPECT_EQ(a.layers[l].slices[s].holders, b.layers[l].slices[s].holders);
    layouts_of_worker0.insert(a.owned_units(0, l));
  }
  EXPECT_TRUE(seed_changes) << "seeds 1234 and 1235 gave the same layout";
  // Layers differ: worker 0 does not hold the same units in every layer.
  EXPECT_GT(layouts_of_worker0.size(), 1u);
  // The holder sets do not depend on the seed (Note [SDP cover]).
  EXPECT_EQ(a.holder_sets(), c.holder_sets());
}

TEST(SdpAssignment, DisconnectedHolderGraphIsRefused) {
  // k = 1 with N > 1: every unit has one holder, no worker shares anything.
  for (int n : {2, 4, 8})
    expect_config_error(
        [&] {
          assign_neurons({n, 1.0 / n, 0}, {64});
        },
        {"parallel.sdp.coverage", "parallel.dp", "not connected"});
  // A disconnected layout built on purpose: {0,1,2} and {3,4} and {5} alone.
  const std::vector<std::vector<int>> parts = {{0, 1}, {2, 1}, {3, 4}};
  const auto comps = holder_components(6, parts);
  const std::vector<std::vector<int>> expect = {{0, 1, 2}, {3, 4}, {5}};
  EXPECT_EQ(comps, expect);
  EXPECT_FALSE(connected(6, parts));
  expect_config_error([&] { check_holder_graph(6, parts); },
                      {"parallel.sdp.coverage", "parallel.dp", "{0,1,2}", "{3,4}", "{5}"});
  expect_config_error([&] { check_holder_graph(6, parts, "model.n_layer"); },
                      {"parallel.sdp.coverage", "parallel.dp", "model.n_layer"});
  // Joining the parts makes it connected.
  std::vector<std::vector<int>> joined = parts;
  joined.push_back({2, 3});
  joined.push_back({5, 0});
  EXPECT_TRUE(connected(6, joined));
  EXPECT_NO_THROW(check_holder_graph(6, joined));
  EXPECT_EQ(holder_components(6, joined).size(), 1u);
}

TEST(SdpAssignment, DistinctHolderSets) {
  const auto sets = distinct_holder_sets({{3, 1}, {1, 3}, {0, 2}, {2, 0, 0}, {1, 2, 3}});
  const std::vector<std::vector<int>> expect = {{0, 2}, {1, 2, 3}, {1, 3}};
  EXPECT_EQ(sets, expect);
}

TEST(SdpAssignment, BlockCoverExactlyKHoldersAndCTimesNLayerBlocksEach) {
  int checked = 0, refused = 0;
  for (int n = 1; n <= 10; ++n)
    for (int k = 1; k <= n; ++k)
      for (int64_t layers = 1; layers <= 24; ++layers) {
        if ((layers * k) % n != 0) continue;
        const int64_t m = layers * k / n;  // blocks per worker
        // A connected cover exists unless some worker shares no block with another.
        const bool feasible = n == 1 || (k >= 2 && (m >= 2 || k == n));
        SCOPED_TRACE("N=" + std::to_string(n) + " k=" + std::to_string(k) +
                     " n_layer=" + std::to_string(layers));
        if (!feasible) {
          expect_config_error([&] { assign_blocks(options(n, k), layers); },
                              {"parallel.sdp.coverage", "parallel.dp", "model.n_layer"});
          ++refused;
          continue;
        }
        const BlockAssignment a = assign_blocks(options(n, k), layers);
        ++checked;
        // block_order is a permutation of the blocks.
        std::vector<int64_t> sorted = a.block_order;
        std::sort(sorted.begin(), sorted.end());
        for (int64_t b = 0; b < layers; ++b) ASSERT_EQ(sorted[b], b);
        std::vector<int> count(layers, 0);
        for (int w = 0; w < n; ++w) {
          const auto owned = a.owned_blocks(w);
          EXPECT_EQ(static_cast<int64_t>(owned.size()), m) << "worker " << w;
          EXPECT_TRUE(std::is_sorted(owned.begin(), owned.end()));
          for (int64_t b = 0; b < layers; ++b)
            EXPECT_EQ(a.holds(w, b), std::binary_search(owned.begin(), owned.end(), b));
          for (int64_t b : owned) ++count[b];
        }
        for (int64_t b = 0; b < layers; ++b) {
          EXPECT_EQ(count[b], k) << "block " << b;
          ASSERT_EQ(static_cast<int>(a.holders[b].size()), k);
          EXPECT_EQ(a.cover.slices[a.slice_of(b)].holders, a.holders[b]);
        }
        EXPECT_TRUE(connected(n, a.holder_sets()));
      }
  EXPECT_GT(checked, 100);
  EXPECT_GT(refused, 10);
}

TEST(SdpAssignment, BlockOrderFollowsTheSeed) {
  const BlockAssignment a = assign_blocks({4, 0.5, 5}, 16);
  const BlockAssignment b = assign_blocks({4, 0.5, 5}, 16);
  const BlockAssignment c = assign_blocks({4, 0.5, 6}, 16);
  EXPECT_EQ(a.block_order, b.block_order);
  EXPECT_EQ(a.holders, b.holders);
  EXPECT_NE(a.block_order, c.block_order);
  // Spread over depth: worker 0's 8 blocks are not all contiguous runs, as a plain cut would give.
  bool some_scattered = false;
  for (int w = 0; w < 4; ++w) {
    const auto owned = a.owned_blocks(w);
    if (owned.back() - owned.front() + 1 != static_cast<int64_t>(owned.size()))
      some_scattered = true;
  }
  EXPECT_TRUE(some_scattered);
}

TEST(SdpAssignment, ErrorsNameTheirKeys) {
  expect_config_error([] { replication(0, 1.0); }, {"parallel.dp"});
  expect_config_error([] { replication(4, 0.0); }, {"parallel.sdp.coverage"});
  expect_config_error([] { replication(4, 1.5); }, {"parallel.sdp.coverage"});
  expect_config_error([] { replication(4, -0.5); }, {"parallel.sdp.coverage"});
  expect_config_error([] { replication(4, std::nan("")); }, {"parallel.sdp.coverage"});
  expect_config_error([] { replication(4, 0.3); }, {"parallel.sdp.coverage", "parallel.dp"});
  expect_config_error([] { replication(3, 0.5); }, {"parallel.sdp.coverage"});
  EXPECT_EQ(replication(8, 0.25), 2);
  EXPECT_EQ(replication(3, 1.0 / 3), 1);
  EXPECT_EQ(replication(3, 0.666667), 2);  // within 1e-6 of a whole count
  expect_config_error([] { assign_neurons({4, 0.5, 0}, {64, 3}); }, {"model.ffn_hidden"});
  expect_config_error([] { assign_neurons({8, 0.5, 0}, {4}, "model.n_head"); }, {"model.n_head"});
  expect_config_error(
      [] {
        assign_blocks({4, 0.5, 0}, 3);
      },
      {"parallel.sdp.coverage", "model.n_layer"});
  expect_config_error([] { assign_blocks({4, 0.5, 0}, 0); }, {"model.n_layer"});
  expect_config_error([] { parse_level("layer"); }, {"parallel.sdp.level"});
  EXPECT_EQ(parse_level("neuron"), Level::kNeuron);
  EXPECT_EQ(parse_level("block"), Level::kBlock);
  EXPECT_EQ(level_name(parse_level("block")), "block");
  EXPECT_EQ(level_name(parse_level("neuron")), "neuron");
}

}  // namespace
}  // namespace loom::parallel::sdp
