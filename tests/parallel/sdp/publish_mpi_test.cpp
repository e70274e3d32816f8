// tests/parallel/sdp/publish_mpi_test.cpp — SlicePublisher (parallel/sdp/publish.h) under
// mpirun: after publish() every worker's copy of a slice it does not hold equals the values of
// the slice's publisher, holders[id mod k], bitwise, and a holder's copy is untouched, also when
// the holders disagree (which tells the publisher apart); holder sets with k = 1, 2, N/2, N and
// random ones, cyclic windows wrapping round the ranks, the cover of parallel/sdp/assignment.h;
// row blocks and column blocks (strided views) of f32 and f64 matrices; negative ids; the
// received and sent volumes and the message count computed here from the layout; one message
// per (publisher, receiver, dtype), no collective; two publishes in a row; a group that is a
// subgroup of the world; NCCL's point-to-point rules; a worker holding nothing; mismatched or
// invalid slice lists give an error on every rank, not a hang.
// loom-mpi-test: ranks 4 8
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/ops/view.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/sdp/assignment.h"
#include "parallel/sdp/publish.h"
#include "tests/parallel/mpi_test_util.h"
#include "tests/parallel/sdp/sdp_test_util.h"

namespace loom::parallel::sdp {
namespace {

using namespace test_util;  // NOLINT(build/namespaces): the shared test helpers
using testing::member_input;
using testing::same_bits;
using testing::world_rank;
using testing::world_size;

// The publisher as the docs state it: holders[id mod k], the non-negative residue.
int publisher_of(const SliceDef& s) {
  const auto k = static_cast<int64_t>(s.holders.size());
  return s.holders[static_cast<size_t>(((s.id % k) + k) % k)];
}

std::vector<Matrix> test_matrices() {
  return {{37, 12, 0, DType::kF32},
          {12, 41, 1, DType::kF32},
          {29, 7, 0, DType::kF64},
          {5, 33, 1, DType::kF32},
          {9, 26, 1, DType::kF64}};
}

// The slices of test_matrices() (test_util::cut_layout: holder sets of every kind, ids shuffled),
// the same on every rank (one seed); about half of the ids negative.
Layout make_layout(int n, uint64_t seed) {
  Layout l = test_util::cut_layout(test_matrices(), n, seed);
  const auto half = static_cast<int64_t>(l.slices.size()) / 2;
  for (SliceDef& s : l.slices) s.id = 3 * (s.id - half) + 1;
  return l;
}

Shape slice_shape(const Layout& l, const SliceDef& s) {
  const Matrix& mat = l.mats[static_cast<size_t>(s.mat)];
  return mat.dim == 0 ? Shape{s.len, mat.cols} : Shape{mat.rows, s.len};
}

DType slice_dtype(const Layout& l, const SliceDef& s) {
  return l.mats[static_cast<size_t>(s.mat)].dtype;
}

// The trained values of slice `s` at step `salt` as holder `h` has them; h = -1: the value every
// holder agrees on. Any rank can regenerate any of them.
Tensor slice_value(const Layout& l, const SliceDef& s, uint64_t salt, int h = -1) {
  return member_input(static_cast<int>(s.id + 100000), salt * 64 + static_cast<uint64_t>(h + 1),
                      slice_shape(l, s), slice_dtype(l, s));
}

// This worker's model copy: random garbage (never zeros) everywhere, then the held slices'
// trained values (its own when `disagree`, else the common one).
std::vector<Tensor> fill(const Layout& l, int rank, int world, uint64_t salt, bool disagree) {
  std::vector<Tensor> mats;
  for (size_t m = 0; m < l.mats.size(); ++m) {
    const Matrix& mat = l.mats[m];
    mats.push_back(member_input(world + 500, salt * 97 + 13 + m, {mat.rows, mat.cols}, mat.dtype));
  }
  for (const SliceDef& s : l.slices) {
    if (!holds(s, rank)) continue;
    Tensor dst = block(l, mats, s);
    ops::copy_(dst, slice_value(l, s, salt, disagree ? rank : -1));
  }
  return mats;
}

std::vector<PublishedSlice> listed(const Layout& l, const std::vector<Tensor>& mats) {
  std::vector<PublishedSlice> out;
  for (const SliceDef& s : l.slices) out.push_back({s.id, s.holders, block(l, mats, s)});
  return out;
}

// What every slice of `rank`'s copy must be after publish(): a held slice what fill() put
// there, any other its publisher's values. Before publish() (`published` false) every slice
// not held must differ, so the check after it can fail.
void expect_published(const Layout& l, const std::vector<Tensor>& mats, int rank, uint64_t salt,
                      bool disagree, bool published = true) {
  for (const SliceDef& s : l.slices) {
    const Tensor got = block(l, mats, s).contiguous();
    if (holds(s, rank)) {
      EXPECT_TRUE(same_bits(got, slice_value(l, s, salt, disagree ? rank : -1)))
          << "slice " << s.id << " held by rank " << rank << " changed";
      continue;
    }
    const Tensor want = slice_value(l, s, salt, disagree ? publisher_of(s) : -1);
    EXPECT_EQ(same_bits(got, want), published)
        << "slice " << s.id << " on rank " << rank << (published ? " is not" : " already is")
        << " its publisher's (rank " << publisher_of(s) << ") values; step salt " << salt;
  }
}

struct Volume {
  int64_t received = 0, sent = 0;
  int messages_received = 0, messages_sent = 0;
  int64_t staging = 0;  // received, plus each distinct list of slices sent to someone, once
};

// The volumes from the layout alone: every element of a slice not held is received once, a
// published slice is sent to each of its non-holders, one message per peer and dtype with
// something to move.
Volume volume(const Layout& l, int rank, int n) {
  Volume v;
  std::set<std::pair<int, DType>> from, to;
  for (const SliceDef& s : l.slices) {
    const int64_t numel = shape_numel(slice_shape(l, s));
    if (numel == 0) continue;  // an empty slice needs no message
    if (!holds(s, rank)) {
      v.received += numel;
      from.insert({publisher_of(s), slice_dtype(l, s)});
    }
    if (publisher_of(s) == rank) {
      v.sent += numel * (n - static_cast<int64_t>(s.holders.size()));
      for (int r = 0; r < n; ++r) {
        if (!holds(s, r)) to.insert({r, slice_dtype(l, s)});
      }
    }
  }
  v.messages_received = static_cast<int>(from.size());
  v.messages_sent = static_cast<int>(to.size());
  std::set<std::pair<DType, std::set<int64_t>>> lists;  // per receiver and dtype
  for (int r = 0; r < n; ++r) {
    std::map<DType, std::set<int64_t>> to_r;
    for (const SliceDef& s : l.slices) {
      if (publisher_of(s) == rank && !holds(s, r) && shape_numel(slice_shape(l, s)) > 0)
        to_r[slice_dtype(l, s)].insert(s.id);
    }
    for (const auto& [dtype, ids] : to_r) lists.insert({dtype, ids});
  }
  std::map<int64_t, int64_t> numel_of;
  for (const SliceDef& s : l.slices) numel_of[s.id] = shape_numel(slice_shape(l, s));
  v.staging = v.received;
  for (const auto& entry : lists) {
    for (int64_t id : entry.second) v.staging += numel_of[id];
  }
  return v;
}

void expect_volume(const SlicePublisher& p, const Volume& v) {
  EXPECT_EQ(p.elements_received(), v.received);
  EXPECT_EQ(p.elements_sent(), v.sent);
  EXPECT_EQ(p.messages_received(), v.messages_received);
  EXPECT_EQ(p.messages_sent(), v.messages_sent);
  EXPECT_EQ(p.staging_elements(), v.staging);
}

std::unique_ptr<MpiCommunicator> world_group(const std::string& name = "dp") {
  return MpiCommunicator::duplicate(MPI_COMM_WORLD, name, testing::kTestCommTimeoutS);
}

TEST(SlicePublisher, EveryCopyBecomesItsPublishersValues) {
  const int n = world_size(), rank = world_rank();
  auto group = world_group();
  const Layout l = make_layout(n, 21);
  std::set<std::vector<int>> sets;  // the layout covers what it claims to
  for (const SliceDef& s : l.slices) sets.insert(s.holders);
  std::vector<int> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  EXPECT_TRUE(sets.count({0, n - 1}) && sets.count(all) && sets.size() > 8);

  std::vector<Tensor> mats = fill(l, rank, rank, 1, false);
  expect_published(l, mats, rank, 1, false, /*published=*/false);
  SlicePublisher pub(*group, listed(l, mats));
  expect_volume(pub, volume(l, rank, n));
  EXPECT_GT(pub.elements_received(), 0);
  EXPECT_NE(pub.describe().find("SlicePublisher on group dp: " + std::to_string(l.slices.size()) +
                                " slices"),
            std::string::npos)
      << pub.describe();
  // Exactly the planned point-to-point messages, carrying exactly the planned bytes.
  std::mutex mu;
  std::map<std::string, int> count;
  std::map<std::string, int64_t> bytes;
  group->set_observer([&](const CommEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    ++count[e.op];
    bytes[e.op] += e.bytes;
  });
  pub.publish();
  group->set_observer({});
  expect_published(l, mats, rank, 1, false);
  int64_t recv_bytes = 0;
  for (const SliceDef& s : l.slices) {
    if (!holds(s, rank))
      recv_bytes += shape_numel(slice_shape(l, s)) * dtype_size(slice_dtype(l, s));
  }
  const Volume v = volume(l, rank, n);
  EXPECT_EQ(count["recv"], v.messages_received);
  EXPECT_EQ(count["send"], v.messages_sent);
  EXPECT_EQ(bytes["recv"], recv_bytes);
  for (const auto& [op, times] : count)
    EXPECT_TRUE(op == "send" || op == "recv") << "publish() issued " << times << " " << op;
}

// The holders disagree: each holder's copy is its own, receivers get holders[id mod k]'s, which
// no other choice (the first, the last or the lowest-numbered holder) would give for every slice.
TEST(SlicePublisher, ReceiversGetHoldersIdModKAndHoldersKeepTheirOwn) {
  const int n = world_size(), rank = world_rank();
  auto group = world_group();
  const Layout l = make_layout(n, 22);
  int middle = 0;  // slices whose publisher is neither their first nor their last holder
  for (const SliceDef& s : l.slices)
    middle += publisher_of(s) != s.holders.front() && publisher_of(s) != s.holders.back();
  EXPECT_GT(middle, 0);
  std::vector<Tensor> mats = fill(l, rank, rank, 2, true);
  expect_published(l, mats, rank, 2, true, /*published=*/false);
  SlicePublisher pub(*group, listed(l, mats));
  pub.publish();
  expect_published(l, mats, rank, 2, true);
}

// A second publish() sends the values the holders have by then (new ones), through the same
// staging, and overwrites what the first one wrote.
TEST(SlicePublisher, TwoPublishesInARow) {
  const int n = world_size(), rank = world_rank();
  auto group = world_group();
  const Layout l = make_layout(n, 23);
  std::vector<Tensor> mats = fill(l, rank, rank, 3, false);
  SlicePublisher pub(*group, listed(l, mats));
  pub.publish();
  expect_published(l, mats, rank, 3, false);
  for (uint64_t salt : {4, 5}) {
    const bool disagree = salt == 5;
    const std::vector<Tensor> next = fill(l, rank, rank, salt, disagree);
    for (size_t m = 0; m < mats.size(); ++m) ops::copy_(mats[m], next[m]);  // in place
    pub.publish();
    expect_published(l, mats, rank, salt, disagree);
    expect_volume(pub, volume(l, rank, n));
  }
}

// The cover of parallel/sdp/assignment.h (cyclic windows of k = 2, N/2, N): every layer's fc
// row slices (contiguous) and proj column slices (strided) of the units a worker does not own
// arrive; the received volume is Σ_l (U_l − owned units)·(d_fc + d_proj), i.e. (1 − C)·Ψ_s up
// to the rounding of the owned counts.
TEST(SlicePublisher, TheNeuronCoverReceivesTheUnownedUnits) {
  const int n = world_size(), rank = world_rank();
  auto group = world_group();
  const std::vector<int64_t> units = {3 * n + 1, 2 * n, 5 * n - 1};
  const int64_t d_model = 6;
  for (int k : {2, n / 2, n}) {
    CoverOptions o;
    o.workers = n;
    o.coverage = static_cast<double>(k) / n;
    o.seed = 31 + static_cast<uint64_t>(k);
    const NeuronAssignment cover = assign_neurons(o, units);
    Layout l;
    int64_t want_received = 0;
    for (size_t layer = 0; layer < units.size(); ++layer) {
      const int fc = static_cast<int>(l.mats.size());
      l.mats.push_back({units[layer], d_model, 0, DType::kF32});      // fc: rows are units
      l.mats.push_back({d_model + 1, units[layer], 1, DType::kF32});  // proj: columns are units
      const LayerCover& lc = cover.layers[layer];
      for (size_t s = 0; s < lc.slices.size(); ++s) {
        const UnitSlice& u = lc.slices[s];
        const int64_t id = (static_cast<int64_t>(layer) * n + static_cast<int64_t>(s)) * 2;
        l.slices.push_back({id, fc, u.begin, u.size(), u.holders});
        l.slices.push_back({id + 1, fc + 1, u.begin, u.size(), u.holders});
      }
      want_received += (units[layer] - lc.owned_count(rank)) * (2 * d_model + 1);
    }
    std::vector<Tensor> mats = fill(l, rank, rank, 6 + static_cast<uint64_t>(k), true);
    SlicePublisher pub(*group, listed(l, mats));
    EXPECT_EQ(pub.elements_received(), want_received) << "k = " << k;
    expect_volume(pub, volume(l, rank, n));
    pub.publish();
    expect_published(l, mats, rank, 6 + static_cast<uint64_t>(k), true);
    if (k == n) {
      EXPECT_EQ(pub.messages_received() + pub.messages_sent(), 0);
    }
  }
}

// Holders are ranks of the group: the world split into two halves, each publishing its own
// layout over its own communicator (created from the world with MpiCommunicator::create).
TEST(SlicePublisher, HoldersAreRanksOfASubgroup) {
  const int n = world_size(), rank = world_rank();
  const int half = rank < n / 2 ? 0 : 1;
  std::vector<int> members;
  for (int r = half * (n / 2); r < (half + 1) * (n / 2); ++r) members.push_back(r);
  auto group = MpiCommunicator::create(MPI_COMM_WORLD, members, "sdp_half",
                                       testing::kTestCommTimeoutS, 0x3a0 + half);
  ASSERT_EQ(group->size(), n / 2);
  const int gr = group->rank();
  EXPECT_EQ(members[static_cast<size_t>(gr)], rank);
  const Layout l = make_layout(n / 2, 24 + static_cast<uint64_t>(half));
  std::vector<Tensor> mats = fill(l, gr, rank, 7, true);  // garbage differs per world rank
  SlicePublisher pub(*group, listed(l, mats));
  expect_volume(pub, volume(l, gr, n / 2));
  pub.publish();
  expect_published(l, mats, gr, 7, true);
}

// Under NCCL's rules (every transfer occupies the group, sends synchronous) the one
// send/recv group still completes: publication is deadlock-free on NCCL.
TEST(SlicePublisher, CompletesUnderNcclRules) {
  const int n = world_size(), rank = world_rank();
  auto group = world_group("dp_nccl_rules");
  group->follow_nccl_rules();
  const Layout l = make_layout(n, 25);
  std::vector<Tensor> mats = fill(l, rank, rank, 8, true);
  SlicePublisher pub(*group, listed(l, mats));
  for (uint64_t salt : {8, 9}) {
    if (salt == 9) {
      const std::vector<Tensor> next = fill(l, rank, rank, salt, true);
      for (size_t m = 0; m < mats.size(); ++m) ops::copy_(mats[m], next[m]);
    }
    pub.publish();
    expect_published(l, mats, rank, salt, true);
  }
}

// k = 1 everywhere (each slice held by one worker, rank 0 holding nothing), and an empty slice:
// rank 0 receives the whole model and sends nothing.
TEST(SlicePublisher, SingleHoldersAndAWorkerHoldingNothing) {
  const int n = world_size(), rank = world_rank();
  auto group = world_group();
  Layout l = make_layout(n, 26);
  for (size_t i = 0; i < l.slices.size(); ++i)
    l.slices[i].holders = {1 + static_cast<int>(i) % (n - 1)};
  l.slices.push_back({-1000, 0, 5, 0, {0, 2}});  // zero rows: no message for it
  std::vector<Tensor> mats = fill(l, rank, rank, 10, false);
  SlicePublisher pub(*group, listed(l, mats));
  expect_volume(pub, volume(l, rank, n));
  if (rank == 0) {
    int64_t total = 0;
    for (const Matrix& m : l.mats) total += m.rows * m.cols;
    EXPECT_EQ(pub.elements_received(), total);
    EXPECT_EQ(pub.elements_sent(), 0);
  } else {  // its slices go to the n − 1 others alike: staged once
    EXPECT_EQ(pub.staging_elements() - pub.elements_received(), pub.elements_sent() / (n - 1));
  }
  pub.publish();
  expect_published(l, mats, rank, 10, false);
}

// Every rank throws (none hangs) and the message names the slice.
void expect_error_everywhere(Communicator& group, std::vector<PublishedSlice> slices,
                             const std::string& words) {
  try {
    SlicePublisher pub(group, std::move(slices));
    ADD_FAILURE() << "no error; expected one containing '" << words << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(SlicePublisher, MismatchedOrInvalidListsFailOnEveryRank) {
  const int n = world_size(), rank = world_rank();
  auto group = world_group();
  Tensor a = Tensor::zeros({3, 4}), b = Tensor::zeros({5});
  // Rank 1 states slice 9's shape differently (a column block); slice 4 agrees everywhere.
  expect_error_everywhere(*group, {{4, {0}, b}, {9, {0, 1}, rank == 1 ? a.narrow(1, 0, 2) : a}},
                          "slice 9 is stated differently by rank 0 (shape (3x4), dtype f32, "
                          "holders {0,1}) and rank 1 (shape (3x2)");
  // The last rank states other holders for slice 2 (the first difference, before slice 9's).
  expect_error_everywhere(
      *group,
      {{9, {0, 1}, rank == 1 ? a.narrow(1, 0, 2) : a},
       {2, rank == n - 1 ? std::vector<int>{1} : std::vector<int>{0}, b}},
      "slice 2 is stated differently by rank 0 (shape (5), dtype f32, holders {0}) and rank " +
          std::to_string(n - 1));
  // Rank 2 leaves slice 7 out; then rank 2 lists slice 3 that no other rank does.
  std::vector<PublishedSlice> c = {{4, {0}, b}};
  if (rank != 2) c.push_back({7, {0, 1}, a});
  expect_error_everywhere(*group, c, "slice 7 is listed by rank 0 (shape (3x4)");
  std::vector<PublishedSlice> d = {{4, {0}, b}};
  if (rank == 2) d.push_back({3, {0, 1}, a});
  expect_error_everywhere(*group, d, "slice 3 is listed by rank 2");
  // A dtype differs.
  expect_error_everywhere(
      *group, {{4, {0}, rank == 3 ? Tensor::zeros({5}, DType::kF64) : b}},
      "slice 4 is stated differently by rank 0 (shape (5), dtype f32, holders {0}) and rank 3 "
      "(shape (5), dtype f64");
  // Invalid on one rank: its own message there, a pointer to it elsewhere.
  expect_error_everywhere(
      *group, {{4, {0}, b}, {rank == 2 ? 4 : 5, {0}, b}},
      rank == 2 ? "slice 4 on rank 2: listed twice" : "rank 2's slice list is invalid");
  expect_error_everywhere(*group,
                          {{4, rank == 1 ? std::vector<int>{1, 0} : std::vector<int>{0}, b}},
                          rank == 1 ? "holders {1,0} must be ascending distinct ranks"
                                    : "rank 1's slice list is invalid");
  expect_error_everywhere(
      *group, {{4, rank == 3 ? std::vector<int>{0, n} : std::vector<int>{0}, b}},
      rank == 3 ? "must be ascending distinct ranks in [0, " + std::to_string(n) + ")"
                : "rank 3's slice list is invalid");
  expect_error_everywhere(*group, {{4, {0}, rank == 0 ? Tensor() : b}},
                          rank == 0 ? "values tensor is undefined" : "rank 0's slice list");
  // And the group is still usable afterwards.
  Tensor v = Tensor::full({2, 3}, rank + 1);
  SlicePublisher pub(*group, {{11, {1}, v}});
  pub.publish();
  EXPECT_EQ(v.to_vector(), std::vector<double>(6, 2.0));
}

}  // namespace
}  // namespace loom::parallel::sdp
