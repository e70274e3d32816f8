// tests/data/loader_test.cpp — DataLoader over shards whose token at stream position p is p, so
// every batch row says exactly which window it is: shapes and dtypes, targets = inputs shifted
// by one, windows spanning shard boundaries, whole-epoch coverage, determinism per seed, rank
// streams disjoint with union equal to the world-size-1 batch, exact resume from state(), and
// the errors for data too small for a window or a global batch.
#include "data/loader.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "data/shard.h"
#include "tests/data/data_test_util.h"

namespace loom {
namespace {

// Shards of the given sizes over one stream whose token at position p is p.
std::vector<std::string> positional_shards(const data_test::TempDir& dir,
                                           const std::vector<int32_t>& sizes) {
  std::vector<std::string> paths;
  int32_t next = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<int32_t> tokens(static_cast<size_t>(sizes[s]));
    for (int32_t& t : tokens) t = next++;
    paths.push_back(dir.file("train_" + std::to_string(s) + ".bin"));
    write_shard(paths.back(), tokens);
  }
  return paths;
}

using Rows = std::vector<std::vector<int32_t>>;

Rows rows(const Tensor& t) {
  Rows out(static_cast<size_t>(t.size(0)));
  const int32_t* p = t.data<int32_t>();
  for (size_t b = 0; b < out.size(); ++b) out[b].assign(p + b * t.size(1), p + (b + 1) * t.size(1));
  return out;
}

std::vector<Rows> take(DataLoader& loader, int steps) {
  std::vector<Rows> out;
  for (int i = 0; i < steps; ++i) out.push_back(rows(loader.next().inputs));
  return out;
}

constexpr int64_t kT = 16;

class LoaderTest : public ::testing::Test {
 protected:
  data_test::TempDir dir_;
  // 1000 + 37 + 2000 + 0 tokens: windows cross shard ends, and one shard is empty.
  std::vector<std::string> paths_ = positional_shards(dir_, {1000, 37, 2000, 0});
};

TEST_F(LoaderTest, BatchesAreShiftedWindows) {
  DataLoader loader(paths_, 4, kT, 0, 1, 7);
  EXPECT_EQ(loader.num_tokens(), 3037);
  EXPECT_EQ(loader.num_windows(), (3037 - 1) / kT);
  EXPECT_EQ(loader.steps_per_epoch(), loader.num_windows() / 4);
  bool crossed_shard = false;
  for (int step = 0; step < 2 * loader.steps_per_epoch() + 3; ++step) {
    const Batch b = loader.next();
    ASSERT_EQ(b.inputs.shape(), (Shape{4, kT}));
    ASSERT_EQ(b.targets.shape(), (Shape{4, kT}));
    ASSERT_EQ(b.inputs.dtype(), DType::kI32);
    const Rows in = rows(b.inputs), tg = rows(b.targets);
    for (size_t r = 0; r < in.size(); ++r) {
      ASSERT_EQ(in[r][0] % kT, 0) << "windows start at multiples of T";
      for (int64_t t = 0; t < kT; ++t) {
        ASSERT_EQ(in[r][t], in[r][0] + t);
        ASSERT_EQ(tg[r][t], in[r][t] + 1) << "targets are inputs shifted by one";
      }
      crossed_shard |= in[r][0] < 1000 && in[r][0] + kT >= 1000;
    }
  }
  EXPECT_TRUE(crossed_shard) << "some window should span the first shard boundary";
}

TEST_F(LoaderTest, EachEpochVisitsDistinctWindows) {
  DataLoader loader(paths_, 4, kT, 0, 1, 3);
  const int64_t steps = loader.steps_per_epoch();
  std::set<int32_t> first, second;
  for (const Rows& b : take(loader, static_cast<int>(steps))) {
    for (const auto& r : b) first.insert(r[0]);
  }
  EXPECT_EQ(static_cast<int64_t>(first.size()), steps * 4);  // no window twice in an epoch
  EXPECT_EQ(loader.state(), (LoaderState{0, steps * 4}));
  for (const Rows& b : take(loader, static_cast<int>(steps))) {
    for (const auto& r : b) second.insert(r[0]);
  }
  EXPECT_EQ(static_cast<int64_t>(second.size()), steps * 4);
  EXPECT_EQ(loader.state().epoch, 1);
  EXPECT_EQ(loader_permutation(loader.num_windows(), 3, 0).size(),
            static_cast<size_t>(loader.num_windows()));
  EXPECT_NE(loader_permutation(loader.num_windows(), 3, 0),
            loader_permutation(loader.num_windows(), 3, 1));  // a new order each epoch
}

TEST_F(LoaderTest, SameSeedSameBatchesOtherSeedDiffers) {
  DataLoader a(paths_, 4, kT, 0, 1, 11), b(paths_, 4, kT, 0, 1, 11), c(paths_, 4, kT, 0, 1, 12);
  const auto sa = take(a, 100), sb = take(b, 100), sc = take(c, 100);
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST_F(LoaderTest, RankStreamsPartitionTheGlobalBatch) {
  constexpr int kWorld = 4;
  constexpr int64_t kB = 2;
  DataLoader single(paths_, kB * kWorld, kT, 0, 1, 5);
  std::vector<DataLoader> ranks;
  for (int r = 0; r < kWorld; ++r) ranks.emplace_back(paths_, kB, kT, r, kWorld, 5);
  for (int step = 0; step < 60; ++step) {  // past an epoch boundary (23 steps per epoch)
    const Rows whole = rows(single.next().inputs);
    Rows joined;
    std::set<int32_t> starts;
    for (auto& loader : ranks) {
      for (auto& row : rows(loader.next().inputs)) {
        starts.insert(row[0]);
        joined.push_back(std::move(row));
      }
    }
    EXPECT_EQ(joined, whole) << "step " << step;
    EXPECT_EQ(starts.size(), static_cast<size_t>(kB * kWorld)) << "ranks overlap at " << step;
  }
  EXPECT_EQ(single.state(), ranks[0].state());
  EXPECT_EQ(ranks[1].state(), ranks[3].state());
}

TEST_F(LoaderTest, ResumeFromStateContinuesIdentically) {
  for (const int warmup : {0, 5, 22, 23, 24}) {  // 23 steps per epoch (G = 8 of 189 windows)
    DataLoader first(paths_, 4, kT, 1, 2, 99);
    take(first, warmup);
    const LoaderState saved = first.state();
    const auto expected = take(first, 30);
    DataLoader resumed(paths_, 4, kT, 1, 2, 99);
    resumed.set_state(saved);
    EXPECT_EQ(resumed.state(), saved);
    EXPECT_EQ(take(resumed, 30), expected) << "after " << warmup << " steps";
  }
}

TEST_F(LoaderTest, ClearErrors) {
  const auto message = [&](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  data_test::TempDir small("small");
  const auto small_paths = positional_shards(small, {10});
  EXPECT_NE(message([&] {
              DataLoader(small_paths, 1, kT, 0, 1, 0);
            }).find("hold 10 tokens, fewer than one window of T+1 = 17 tokens"),
            std::string::npos);
  EXPECT_NE(message([&] {
              DataLoader(paths_, 100, kT, 0, 2, 0);
            }).find("fewer than one global batch of B*world_size = 200 windows"),
            std::string::npos);
  EXPECT_NE(message([&] { DataLoader(paths_, 1, kT, 2, 2, 0); }).find("rank 2"), std::string::npos);
  EXPECT_NE(message([&] {
              DataLoader({dir_.file("nope.bin")}, 1, kT, 0, 1, 0);
            }).find("nope.bin: cannot open shard"),
            std::string::npos);
  DataLoader loader(paths_, 4, kT, 0, 1, 0);
  EXPECT_NE(message([&] {
              loader.set_state({0, 100000});
            }).find("outside this data's"),
            std::string::npos);
  // With a vocabulary, a token outside it is found when the shards are opened, naming the shard
  // and the offset (positional shards: token p sits at position p, the first shard's 20 first).
  data_test::TempDir ids("ids");
  const auto id_paths = positional_shards(ids, {20, 30});
  EXPECT_EQ(message([&] { DataLoader(id_paths, 1, kT, 0, 1, 0, 50); }), "no error");
  const std::string msg = message([&] { DataLoader(id_paths, 1, kT, 0, 1, 0, 33); });
  EXPECT_EQ(msg, id_paths[1] +
                     ": token 33 at offset 13 (of 30 tokens) is outside model.vocab_size 33 (the "
                     "shard was written for another vocabulary?)");
}

}  // namespace
}  // namespace loom
