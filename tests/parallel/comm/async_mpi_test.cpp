// tests/parallel/comm/async_mpi_test.cpp — asynchronous behaviour of MpiCommunicator: operations
// progress on the communicator's thread while the caller computes (is_done turns true with
// no wait), many queued operations complete correctly and in issue order, the observer sees
// every operation, and send/recv rings (including large, rendezvous-sized messages) work —
// also as send_recv_async groups under NCCL's rules (Note [NCCL rules on MPI]), where separate
// crossed sends deadlock; the time callers block in wait() is counted.
// loom-mpi-test: ranks 4
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "parallel/comm/mpi_communicator.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using testing::member_input;
using testing::same_bits;
using testing::world_rank;
using testing::world_size;

std::unique_ptr<MpiCommunicator> world_comm(const char* name = "world") {
  return MpiCommunicator::duplicate(MPI_COMM_WORLD, name, testing::kTestCommTimeoutS);
}

Tensor sum_of_inputs(uint64_t id, const Shape& shape, DType dt) {
  Tensor acc = member_input(0, id, shape, dt);
  for (int r = 1; r < world_size(); ++r) {
    const Tensor x = member_input(r, id, shape, dt);
    if (dt == DType::kF32) {
      for (int64_t i = 0; i < acc.numel(); ++i) acc.data<float>()[i] += x.data<float>()[i];
    } else {
      for (int64_t i = 0; i < acc.numel(); ++i) acc.data<double>()[i] += x.data<double>()[i];
    }
  }
  return acc;
}

TEST(Async, AllReduceProgressesWhileCallerComputes) {
  auto comm = world_comm();
  const Shape shape = {1 << 18};
  Tensor t = member_input(world_rank(), 7, shape, DType::kF32);
  WorkPtr work = comm->all_reduce_async(t, ReduceOp::kSum);
  // Compute without ever calling into the communicator; only look at is_done().
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  double sink = 0;
  int64_t iterations = 0;
  while (!work->is_done() && Clock::now() < deadline) {
    for (int i = 0; i < 2000; ++i) sink += std::sin(static_cast<double>(i + iterations));
    ++iterations;
  }
  EXPECT_TRUE(work->is_done()) << "all_reduce made no progress in 20 s of caller compute";
  EXPECT_GT(iterations, 0);
  EXPECT_TRUE(std::isfinite(sink));
  work->wait();
  EXPECT_TRUE(same_bits(t, sum_of_inputs(7, shape, DType::kF32)));
}

TEST(Async, ManyQueuedOperationsCompleteInIssueOrder) {
  auto comm = world_comm("dp");
  std::mutex mu;
  std::vector<CommEvent> events;
  comm->set_observer([&](const CommEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  });
  const int k = comm->size();
  std::vector<Tensor> reduced, gathered_in, gathered_out;
  std::vector<WorkPtr> works;
  for (int i = 0; i < 12; ++i) {
    const DType dt = i % 2 ? DType::kF64 : DType::kF32;
    reduced.push_back(member_input(world_rank(), 100 + i, {1000 + 37 * i}, dt));
    works.push_back(comm->all_reduce_async(reduced.back(), ReduceOp::kSum));
    gathered_in.push_back(member_input(world_rank(), 200 + i, {5 + i}, dt));
    gathered_out.push_back(Tensor::empty({k * (5 + i)}, dt));
    works.push_back(comm->all_gather_async(gathered_in.back(), gathered_out.back()));
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();  // any wait order
  for (int i = 0; i < 12; ++i) {
    const DType dt = i % 2 ? DType::kF64 : DType::kF32;
    EXPECT_TRUE(
        same_bits(reduced[static_cast<size_t>(i)], sum_of_inputs(100 + i, {1000 + 37 * i}, dt)))
        << i;
    for (int r = 0; r < k; ++r) {
      Tensor want = member_input(r, 200 + i, {5 + i}, dt);
      Tensor got = gathered_out[static_cast<size_t>(i)].narrow(0, r * (5 + i), 5 + i).contiguous();
      EXPECT_TRUE(same_bits(got, want)) << i << " chunk " << r;
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(events.size(), works.size());  // delivered before each wait returned
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].group, "dp");
    EXPECT_EQ(events[i].op, i % 2 ? "all_gather" : "all_reduce");
    EXPECT_LE(events[i].queued, events[i].started);
    EXPECT_LE(events[i].started, events[i].finished);
    if (i > 0) {
      EXPECT_LE(events[i - 1].finished, events[i].started) << "collectives overlapped";
    }
  }
  EXPECT_EQ(events[0].bytes, 1000 * 4);
  EXPECT_EQ(events[1].bytes, k * 5 * 4);
}

TEST(Async, GroupsProgressIndependently) {
  // Even ranks issue on A then B, odd ranks on B then A: only independent progress per
  // communicator (one thread each) lets both complete.
  auto a = world_comm("a");
  auto b = world_comm("b");
  Tensor x = member_input(world_rank(), 500, {1000}, DType::kF64);
  Tensor y = member_input(world_rank(), 501, {1000}, DType::kF64);
  WorkPtr wx, wy;
  if (world_rank() % 2 == 0) {
    wx = a->all_reduce_async(x, ReduceOp::kSum);
    wy = b->all_reduce_async(y, ReduceOp::kSum);
  } else {
    wy = b->all_reduce_async(y, ReduceOp::kSum);
    wx = a->all_reduce_async(x, ReduceOp::kSum);
  }
  wx->wait();
  wy->wait();
  EXPECT_TRUE(same_bits(x, sum_of_inputs(500, {1000}, DType::kF64)));
  EXPECT_TRUE(same_bits(y, sum_of_inputs(501, {1000}, DType::kF64)));
}

TEST(Async, WaitedSecondsCountTheCallersBlockedTime) {
  // Rank 0 joins an all-reduce 0.3 s late: every other rank blocks in wait() for about that
  // long, and its communicator counts it (Communicator::waited_s: the trainer's tp and cp
  // exposed communication); a wait on a finished operation adds next to nothing.
  auto c = world_comm();
  EXPECT_EQ(c->waited_s(), 0.0);
  c->barrier();
  const double before = c->waited_s();
  if (world_rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Tensor x = member_input(world_rank(), 510, {64}, DType::kF64);
  c->all_reduce(x, ReduceOp::kSum);
  const double waited = c->waited_s() - before;
  if (world_rank() != 0) {
    EXPECT_GE(waited, 0.25) << "rank " << world_rank();
  }
  WorkPtr w = c->barrier_async();
  while (!w->is_done()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const double done_before = c->waited_s();
  w->wait();
  EXPECT_LT(c->waited_s() - done_before, 0.1);  // microseconds; 0.1 s: a descheduled thread
}

TEST(SendRecv, RingOfAsyncSendsAndReceives) {
  auto comm = world_comm("pp");
  const int k = comm->size(), r = comm->rank();
  const int next = (r + 1) % k, prev = (r + k - 1) % k;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{1} << 20}) {  // 8 MiB: rendezvous
    for (DType dt : {DType::kF64, DType::kI32}) {
      const uint64_t id = 300 + static_cast<uint64_t>(n) + (dt == DType::kF64 ? 0 : 1);
      Tensor out = member_input(r, id, {n}, dt);
      Tensor in = Tensor::empty({n}, dt);
      // Every rank sends first: a worker that blocked on its send would deadlock here.
      WorkPtr s = comm->send_async(out, next, 5);
      WorkPtr v = comm->recv_async(in, prev, 5);
      v->wait();
      s->wait();
      EXPECT_TRUE(same_bits(in, member_input(prev, id, {n}, dt))) << "n=" << n;
    }
  }
  // Blocking forms, the other way round the ring, distinguished by tags.
  Tensor a = member_input(r, 400, {33}, DType::kF32), b = member_input(r, 401, {33}, DType::kF32);
  Tensor ga = Tensor::empty({33}), gb = Tensor::empty({33});
  if (r % 2 == 0) {
    comm->send(a, prev, 1);
    comm->send(b, prev, 2);
    comm->recv(gb, next, 2);
    comm->recv(ga, next, 1);
  } else {
    WorkPtr wb = comm->recv_async(gb, next, 2);
    comm->recv(ga, next, 1);
    wb->wait();
    comm->send(a, prev, 1);
    comm->send(b, prev, 2);
  }
  EXPECT_TRUE(same_bits(ga, member_input(next, 400, {33}, DType::kF32)));
  EXPECT_TRUE(same_bits(gb, member_input(next, 401, {33}, DType::kF32)));
  comm->barrier();
}

std::unique_ptr<MpiCommunicator> nccl_rules_comm(double timeout_s = testing::kTestCommTimeoutS) {
  auto comm = MpiCommunicator::duplicate(MPI_COMM_WORLD, "pp", timeout_s);
  comm->follow_nccl_rules();
  return comm;
}

TEST(SendRecv, GroupsUnderNcclRules) {
  auto comm = nccl_rules_comm();
  const int k = comm->size(), r = comm->rank();
  if (k < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (r + 1) % k, prev = (r + k - 1) % k;
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{1} << 20}) {
    // Both directions at once, in a different order on odd ranks.
    Tensor to_next = member_input(r, 600 + static_cast<uint64_t>(n), {n}, DType::kF64);
    Tensor to_prev = member_input(r, 700 + static_cast<uint64_t>(n), {n}, DType::kF64);
    Tensor from_prev = Tensor::empty({n}, DType::kF64), from_next = Tensor::empty({n}, DType::kF64);
    std::vector<P2P> ops = {P2P::send(to_next, next, 1), P2P::recv(from_prev, prev, 1),
                            P2P::send(to_prev, prev, 2), P2P::recv(from_next, next, 2)};
    if (r % 2 == 1) std::reverse(ops.begin(), ops.end());
    std::vector<WorkPtr> works = comm->send_recv_async(ops);
    ASSERT_EQ(works.size(), 4u);
    for (WorkPtr& w : works) w->wait();
    EXPECT_TRUE(
        same_bits(from_prev, member_input(prev, 600 + static_cast<uint64_t>(n), {n}, DType::kF64)))
        << n;
    EXPECT_TRUE(
        same_bits(from_next, member_input(next, 700 + static_cast<uint64_t>(n), {n}, DType::kF64)))
        << n;
  }
  comm->barrier();
}

TEST(SendRecv, CrossedSendsDeadlockUnderNcclRules) {
  // Every rank sends to the next before receiving from the previous, as separate operations:
  // fine on MPI (above), a deadlock under NCCL's rules — which must show as the timeout.
  auto comm = nccl_rules_comm(1.0);
  auto sync = MpiCommunicator::duplicate(MPI_COMM_WORLD, "sync", testing::kTestCommTimeoutS);
  const int k = comm->size(), r = comm->rank();
  if (k < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (r + 1) % k, prev = (r + k - 1) % k;
  Tensor out = member_input(r, 800, {64}, DType::kF64), in = Tensor::empty({64}, DType::kF64);
  WorkPtr s = comm->send_async(out, next, 5);
  WorkPtr v = comm->recv_async(in, prev, 5);
  try {
    s->wait();
    ADD_FAILURE() << "the crossed send completed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not complete"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(v->is_done());
  // Every rank has seen its timeout before any rank unblocks its neighbour (without this a rank
  // that started late would see its send taken by the hand-written receive below in time).
  sync->barrier();
  // Unblock by hand on the same MPI communicator: take the previous rank's pending send, then
  // answer the next rank's receive, which starts once its own send is gone.
  std::vector<double> got(64), mine = out.to_vector();
  MPI_Recv(got.data(), 64, MPI_DOUBLE, prev, 5, comm->mpi_comm(), MPI_STATUS_IGNORE);
  MPI_Send(mine.data(), 64, MPI_DOUBLE, next, 5, comm->mpi_comm());
  // Past their deadline, wait() would throw at once: poll instead.
  const auto limit = Clock::now() + std::chrono::seconds(30);
  while (!(s->is_done() && v->is_done()) && Clock::now() < limit)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(s->is_done() && v->is_done());
  EXPECT_EQ(got, member_input(prev, 800, {64}, DType::kF64).to_vector());
  EXPECT_TRUE(same_bits(in, member_input(prev, 800, {64}, DType::kF64)));
}

TEST(SendRecv, ShortMessageIsAnError) {
  auto comm = world_comm("pp");
  const int k = comm->size(), r = comm->rank();
  if (k < 2) GTEST_SKIP() << "needs two ranks";
  if (r == 0) comm->send(Tensor::zeros({10}), 1, 3);
  if (r == 1) {
    try {
      comm->recv(Tensor::zeros({12}), 0, 3);
      ADD_FAILURE() << "short message accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "recv from rank 0 (tag 3) on group pp: received 10 elements, expected 12"),
                std::string::npos)
          << e.what();
    }
  }
  comm->barrier();
}

}  // namespace
}  // namespace loom::parallel
