// tests/parallel/sdp/slice_sync_mpi_test.cpp — SliceSync (parallel/sdp/slice_sync.h) under
// mpirun: each slice's gradient becomes the average over exactly its holders (k = 1, 2, N/2, N
// and random sets, cyclic windows wrapping round the ranks included), computed here from every
// rank's inputs regenerated from their seeds; slices a worker does not hold stay untouched;
// hooks may fire in any order, differing between workers, and launch() issues the reductions
// before finish(); tiny buckets (many per set, issued in order); repeated steps; bitwise the
// same in two runs; a worker holding nothing joins no group; a dp group that is not the world
// (holders are dp ranks); inconsistent slice lists give one error on every rank, not a hang.
// loom-mpi-test: ranks 4 8
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/ops/view.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/parallel_context.h"
#include "parallel/sdp/slice_sync.h"
#include "tests/parallel/mpi_test_util.h"
#include "tests/parallel/sdp/sdp_test_util.h"

namespace loom::parallel::sdp {
namespace {

using namespace test_util;  // NOLINT(build/namespaces): the shared test helpers
using testing::bits_hash;
using testing::member_input;
using testing::same_bits;
using testing::world_rank;
using testing::world_size;

// Gradient matrices and their slices (test_util::cut_layout: holder sets of every kind among the
// dp ranks, ids shuffled), the same on every rank (one seed).
Layout make_layout(int n, uint64_t seed) {
  Layout l = test_util::cut_layout({{37, 12, 0, DType::kF32},
                                    {12, 41, 1, DType::kF32},
                                    {29, 7, 0, DType::kF64},
                                    {5, 33, 1, DType::kF32}},
                                   n, seed);
  for (SliceDef& s : l.slices) s.id = 3 * s.id + 1;
  return l;
}

// The gradient matrices of world rank `rank` for step `salt`.
std::vector<Tensor> inputs(const Layout& l, int rank, uint64_t salt) {
  std::vector<Tensor> out;
  for (size_t m = 0; m < l.mats.size(); ++m) {
    const Matrix& mat = l.mats[m];
    out.push_back(member_input(rank, salt * 100 + m, {mat.rows, mat.cols}, mat.dtype));
  }
  return out;
}

std::vector<HeldSlice> held(const Layout& l, const std::vector<Tensor>& mats, int dp_rank) {
  std::vector<HeldSlice> out;
  for (const SliceDef& s : l.slices) {
    if (holds(s, dp_rank)) out.push_back({s.id, s.holders, block(l, mats, s)});
  }
  return out;
}

// Σ over the holders in ascending rank, divided by their count, in the slice's dtype (the
// contract of Note [Deterministic reductions]), from the holders' regenerated inputs.
Tensor expected_average(const Layout& l, const SliceDef& s, const std::vector<int>& world_of_dp,
                        uint64_t salt) {
  Tensor acc;
  for (int h : s.holders) {
    const Tensor x = block(l, inputs(l, world_of_dp[static_cast<size_t>(h)], salt), s).contiguous();
    if (!acc.defined()) {
      acc = x.clone();
      continue;
    }
    for (int64_t i = 0; i < acc.numel(); ++i) {
      if (acc.dtype() == DType::kF32) {
        acc.data<float>()[i] += x.data<float>()[i];
      } else {
        acc.data<double>()[i] += x.data<double>()[i];
      }
    }
  }
  const double k = static_cast<double>(s.holders.size());
  for (int64_t i = 0; i < acc.numel(); ++i) {
    if (acc.dtype() == DType::kF32) {
      acc.data<float>()[i] /= static_cast<float>(k);
    } else {
      acc.data<double>()[i] /= k;
    }
  }
  return acc;
}

// Held slices hold their average, the others this rank's untouched inputs.
void expect_synced(const Layout& l, const std::vector<Tensor>& got, int dp_rank,
                   const std::vector<int>& world_of_dp, uint64_t salt) {
  const std::vector<Tensor> mine = inputs(l, world_of_dp[static_cast<size_t>(dp_rank)], salt);
  for (const SliceDef& s : l.slices) {
    const Tensor g = block(l, got, s).contiguous();
    if (holds(s, dp_rank)) {
      EXPECT_TRUE(same_bits(g, expected_average(l, s, world_of_dp, salt)))
          << "slice " << s.id << " held by " << holder_group_name(s.holders) << ", rank " << dp_rank
          << ", step salt " << salt;
    } else {
      EXPECT_TRUE(same_bits(g, block(l, mine, s).contiguous()))
          << "slice " << s.id << " not held by rank " << dp_rank << " was modified";
    }
  }
}

std::vector<int> identity_ranks(int n) {
  std::vector<int> r(static_cast<size_t>(n));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

std::unique_ptr<MpiCommunicator> world_dp() {
  return MpiCommunicator::duplicate(MPI_COMM_WORLD, "dp", testing::kTestCommTimeoutS);
}

SliceSyncOptions test_options(size_t bucket_bytes = 25u << 20) {
  SliceSyncOptions o;
  o.bucket_bytes = bucket_bytes;
  o.timeout_s = testing::kTestCommTimeoutS;
  return o;
}

// Launches this rank's slices in an order of its own (seeded by rank), then finishes.
void launch_shuffled(SliceSync& sync, const std::vector<HeldSlice>& slices, uint64_t seed) {
  std::vector<int64_t> ids;
  for (const HeldSlice& s : slices) ids.push_back(s.id);
  std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(world_rank()));
  std::shuffle(ids.begin(), ids.end(), rng);
  for (int64_t id : ids) sync.launch(id);
  sync.finish();
}

TEST(SliceSync, AveragesOverExactlyTheHolders) {
  const int n = world_size(), rank = world_rank();
  auto dp = world_dp();
  const Layout l = make_layout(n, 11);
  std::set<std::vector<int>> all_sets;  // the layout covers what it claims to
  for (const SliceDef& s : l.slices) all_sets.insert(s.holders);
  const bool single = std::any_of(all_sets.begin(), all_sets.end(),
                                  [](const std::vector<int>& h) { return h.size() == 1; });
  EXPECT_TRUE(all_sets.count({0, n - 1}) && all_sets.count(identity_ranks(n)) && single &&
              all_sets.size() > 8);

  std::vector<Tensor> mats = inputs(l, rank, 1);
  const std::vector<HeldSlice> slices = held(l, mats, rank);
  SliceSync sync(*dp, slices, test_options());
  // The groups: exactly this rank's sets of two or more, each ranked by position in the set.
  std::set<std::vector<int>> want;
  for (const HeldSlice& s : slices) {
    if (s.holders.size() > 1) want.insert(s.holders);
  }
  const std::vector<std::vector<int>> sets = sync.holder_sets();
  EXPECT_EQ(std::set<std::vector<int>>(sets.begin(), sets.end()), want);
  EXPECT_TRUE(std::is_sorted(sets.begin(), sets.end()));
  for (const std::vector<int>& h : sets) {
    Communicator& g = sync.group(h);
    EXPECT_EQ(g.name(), holder_group_name(h));
    EXPECT_EQ(g.size(), static_cast<int>(h.size()));
    EXPECT_EQ(h[static_cast<size_t>(g.rank())], rank);
  }
  EXPECT_EQ(holder_group_name({0, 2}), "sdp{0,2}");
  launch_shuffled(sync, slices, 1);
  expect_synced(l, mats, rank, identity_ranks(n), 1);
}

TEST(SliceSync, ManySmallBucketsReversedOrRandomLaunchesOverSteps) {
  const int n = world_size(), rank = world_rank();
  auto dp = world_dp();
  const Layout l = make_layout(n, 12);
  std::vector<Tensor> mats = inputs(l, rank, 1);
  const std::vector<HeldSlice> slices = held(l, mats, rank);
  SliceSync sync(*dp, slices, test_options(64));  // a few slices per bucket at most
  EXPECT_GT(sync.num_buckets(), static_cast<int>(sync.holder_sets().size()));
  for (uint64_t step = 1; step <= 3; ++step) {
    const std::vector<Tensor> fresh = inputs(l, rank, step);
    for (size_t m = 0; m < mats.size(); ++m) ops::copy_(mats[m], fresh[m]);  // in place
    if (rank % 2 == 0) {  // descending id here, random order on the odd ranks
      std::vector<HeldSlice> desc = slices;
      std::sort(desc.begin(), desc.end(), [](auto& a, auto& b) { return a.id > b.id; });
      for (const HeldSlice& s : desc) sync.launch(s.id);
      sync.finish();
    } else {
      launch_shuffled(sync, slices, step);
    }
    expect_synced(l, mats, rank, identity_ranks(n), step);
  }
}

// launch() issues: every bucket's all-reduce completes on the groups' threads before finish().
TEST(SliceSync, LaunchIssuesTheReductionsBeforeFinish) {
  const int n = world_size(), rank = world_rank();
  auto dp = world_dp();
  const Layout l = make_layout(n, 16);
  std::vector<Tensor> mats = inputs(l, rank, 4);
  const std::vector<HeldSlice> slices = held(l, mats, rank);
  SliceSync sync(*dp, slices, test_options(128));
  std::atomic<int> done{0};
  for (const std::vector<int>& h : sync.holder_sets()) {
    sync.group(h).set_observer([&](const CommEvent& e) {
      if (e.op == "all_reduce") ++done;
    });
  }
  for (const HeldSlice& s : slices) sync.launch(s.id);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (done.load() < sync.num_buckets() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(done.load(), sync.num_buckets());
  sync.finish();
  expect_synced(l, mats, rank, identity_ranks(n), 4);
}

TEST(SliceSync, FinishAloneIsBitwiseRepeatable) {
  const int n = world_size(), rank = world_rank();
  auto dp = world_dp();
  const Layout l = make_layout(n, 13);
  std::vector<int64_t> hashes[2];
  for (int run = 0; run < 2; ++run) {
    std::vector<Tensor> mats = inputs(l, rank, 5);
    SliceSync sync(*dp, held(l, mats, rank), test_options(256));
    sync.finish();  // launches everything itself
    expect_synced(l, mats, rank, identity_ranks(n), 5);
    for (const Tensor& m : mats) hashes[run].push_back(bits_hash(m));
  }
  EXPECT_EQ(hashes[0], hashes[1]);
}

TEST(SliceSync, AWorkerHoldingNothingJoinsNoGroup) {
  const int n = world_size(), rank = world_rank();
  auto dp = world_dp();
  Layout l = make_layout(n, 14);
  for (size_t i = 0; i < l.slices.size(); ++i)
    l.slices[i].holders = i % 3 == 0 ? std::vector<int>{1} : std::vector<int>{0, 1};
  std::vector<Tensor> mats = inputs(l, rank, 2);
  SliceSync sync(*dp, held(l, mats, rank), test_options());
  if (rank >= 2) {
    EXPECT_TRUE(sync.holder_sets().empty());
    EXPECT_EQ(sync.num_buckets(), 0);
  } else {
    EXPECT_EQ(sync.holder_sets(), (std::vector<std::vector<int>>{{0, 1}}));
  }
  sync.finish();
  expect_synced(l, mats, rank, identity_ranks(n), 2);
}

// Holders are ranks of the dp group: with dp = n/2 and tp = 2, each tp coordinate has its own
// dp group, and a holder's inputs are those of its world rank.
TEST(SliceSync, HoldersAreDpRanksOfASubGroup) {
  const int n = world_size(), rank = world_rank();
  ParallelOptions o;
  o.shape = {.dp = n / 2, .pp = 1, .cp = 1, .tp = 2};
  o.comm_timeout_s = testing::kTestCommTimeoutS;
  ParallelContext ctx = ParallelContext::create(o);
  const std::vector<int> world_of_dp = ctx.mesh().group_members(rank, {kAxisDp});
  const Layout l = make_layout(ctx.dp_size(), 15);
  std::vector<Tensor> mats = inputs(l, rank, 3);
  const std::vector<HeldSlice> slices = held(l, mats, ctx.dp_rank());
  SliceSync sync(ctx.dp(), slices, test_options());
  launch_shuffled(sync, slices, 3);
  expect_synced(l, mats, ctx.dp_rank(), world_of_dp, 3);
}

// Every rank throws (none hangs) and the message names the slice.
void expect_error_everywhere(Communicator& dp, std::vector<HeldSlice> slices,
                             const std::string& words) {
  try {
    SliceSync sync(dp, std::move(slices), test_options());
    ADD_FAILURE() << "no error; expected one containing '" << words << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(SliceSync, InconsistentSliceListsFailOnEveryRank) {
  const int rank = world_rank();
  auto dp = world_dp();
  Tensor g = Tensor::zeros({3, 4});
  // Rank 0 says slice 7 is held by {0, 1}; rank 1 does not list it.
  std::vector<HeldSlice> a;
  if (rank == 0) a.push_back({7, {0, 1}, g});
  expect_error_everywhere(*dp, a, "slice 7 has holders {0,1} but is listed by ranks {0}");
  // Ranks 0 and 1 disagree on the shape of slice 9.
  std::vector<HeldSlice> b;
  if (rank <= 1) b.push_back({9, {0, 1}, rank == 0 ? g : g.narrow(1, 0, 2)});
  expect_error_everywhere(*dp, b, "slice 9 is stated differently by rank 0");
  // Rank 2 lists a slice whose holders leave it out: its own message there, a pointer elsewhere.
  std::vector<HeldSlice> c;
  if (rank == 2) c.push_back({4, {0, 1}, g});
  expect_error_everywhere(*dp, c, rank == 2 ? "do not include this rank" : "rank 2's slice list");
  // And the layout is still usable afterwards.
  std::vector<HeldSlice> d;
  if (rank <= 1) d.push_back({9, {0, 1}, Tensor::full({2}, rank + 1)});
  SliceSync sync(*dp, d, test_options());
  sync.finish();
  if (rank <= 1) {
    EXPECT_EQ(d[0].grad.to_vector(), (std::vector<double>{1.5, 1.5}));
  }
}

TEST(SliceSync, LaunchingTwiceOrAnUnheldSliceThrows) {
  const int n = world_size(), rank = world_rank();
  auto dp = world_dp();
  Tensor all = Tensor::full({5}, rank), own = Tensor::full({2}, rank);
  SliceSync sync(*dp, {{1, identity_ranks(n), all}, {2 + 3 * rank, {rank}, own}}, test_options());
  sync.launch(1);
  EXPECT_THROW(sync.launch(1), Error);
  EXPECT_THROW(sync.launch(2 + 3 * ((rank + 1) % n)), Error);  // a neighbour's own slice
  sync.finish();
  EXPECT_EQ(all.to_vector(), std::vector<double>(5, (n - 1) / 2.0));
  EXPECT_EQ(own.to_vector(), std::vector<double>(2, rank));
}

}  // namespace
}  // namespace loom::parallel::sdp
