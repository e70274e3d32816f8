// tests/parallel/comm/timeout_mpi_test.cpp — a collective that only some ranks enter: wait() on
// those ranks throws within the communicator's timeout (2 s here), naming the operation and
// the group, and an operation queued behind it says it never started. Then the missing rank
// enters, everything completes with correct results, and the group is usable again.
// loom-mpi-test: ranks 4
// loom-multihost-test: 2x2
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "parallel/comm/mpi_communicator.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using testing::world_rank;
using testing::world_size;

std::string wait_error(const WorkPtr& w) {
  try {
    w->wait();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Timeout, PartialCollectiveReportsOpAndGroupThenRecovers) {
  const int n = world_size();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  auto comm = MpiCommunicator::duplicate(MPI_COMM_WORLD, "dp", 2.0);
  auto sync = MpiCommunicator::duplicate(MPI_COMM_WORLD, "sync", testing::kTestCommTimeoutS);
  const bool late = world_rank() == 0;  // rank 0 stays out of the collective at first
  Tensor t = Tensor::full({5}, 1.0);
  Tensor g = Tensor::empty({n});
  WorkPtr reduce, barrier;
  if (!late) {
    const auto start = Clock::now();
    reduce = comm->all_reduce_async(t, ReduceOp::kSum);
    barrier = comm->all_gather_async(Tensor::full({1}, world_rank()), g);
    const std::string first = wait_error(reduce);
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_NE(first.find(detail::str("collective all_reduce on group dp (", n,
                                     " ranks) did not complete within 2 s")),
              std::string::npos)
        << first;
    EXPECT_GE(waited, 1.9);
    EXPECT_LT(waited, 10.0);
    const std::string second = wait_error(barrier);
    EXPECT_NE(second.find("collective all_gather on group dp"), std::string::npos) << second;
    EXPECT_NE(second.find("it never started"), std::string::npos) << second;
    EXPECT_FALSE(reduce->is_done());
  }
  sync->barrier();  // the others have seen their timeouts
  if (late) {
    reduce = comm->all_reduce_async(t, ReduceOp::kSum);
    barrier = comm->all_gather_async(Tensor::full({1}, world_rank()), g);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!(reduce->is_done() && barrier->is_done()) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(reduce->is_done() && barrier->is_done()) << "did not recover once every rank entered";
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(t.data<float>()[i], static_cast<float>(n));
  for (int i = 0; i < n; ++i) EXPECT_EQ(g.data<float>()[i], static_cast<float>(i));
  comm->barrier();  // usable again
  sync->barrier();
}

}  // namespace
}  // namespace loom::parallel
