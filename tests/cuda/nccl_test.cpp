// tests/cuda/nccl_test.cpp — NcclCommunicator with a world of one (no MPI), reached through
// ParallelContext::single_process(cuda:0): every operation's result equals its definition for
// one rank on fresh random CUDA tensors (outputs poisoned first, odd sizes, several dtypes;
// all results compared bit for bit, since one rank's reduction is the identity), ordering
// against the compute stream, tensors kept alive by the communicator, CommEvents, CPU tensors
// through the in-process host communicator, and argument errors. Skips without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "parallel/parallel_context.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom::cuda_test {
namespace {

using parallel::CommEvent;
using parallel::Communicator;
using parallel::ParallelContext;
using parallel::ReduceOp;
using parallel::WorkPtr;

const std::vector<int64_t> kSizes = {0, 1, 17, 4099, (int64_t{1} << 20) + 3};
const std::vector<DType> kReduceDTypes = {DType::kF32, DType::kF64, DType::kBF16,
                                          DType::kF16, DType::kI32, DType::kI64};

class NcclSelfTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    ctx_ = std::make_unique<ParallelContext>(ParallelContext::single_process(Device::cuda(0)));
  }
  Communicator& dp() { return ctx_->dp(); }
  std::unique_ptr<ParallelContext> ctx_;
};

Tensor random_cuda(int64_t n, DType dtype, Generator& gen, Tensor* host_copy) {
  *host_copy = random_tensor({n}, dtype, gen);
  return host_copy->to(Device::cuda(0));
}

TEST_F(NcclSelfTest, ContextIsOnTheGpuWithGroupsOfOne) {
  EXPECT_EQ(ctx_->device(), Device::cuda(0));
  for (Communicator* c :
       {&ctx_->world(), &ctx_->dp(), &ctx_->tp(), &ctx_->pp(), &ctx_->cp(),
        &ctx_->group({parallel::kAxisMicsPartition}), &ctx_->group({parallel::kAxisMicsReplica})}) {
    EXPECT_EQ(c->size(), 1) << c->name();
    EXPECT_EQ(c->rank(), 0) << c->name();
  }
  EXPECT_EQ(ctx_->tp().name(), "tp");
}

TEST_F(NcclSelfTest, AllReduceIsTheIdentity) {
  Generator gen(11);
  for (DType dt : kReduceDTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      if (op == ReduceOp::kAvg && !is_floating(dt)) continue;
      for (int64_t n : kSizes) {
        Tensor want;
        Tensor t = random_cuda(n, dt, gen, &want);
        dp().all_reduce(t, op);
        expect_same_bits(want, t, detail::str("all_reduce ", dtype_name(dt), " n=", n));
      }
    }
  }
}

TEST_F(NcclSelfTest, ReduceScatterAllGatherAllToAllCopy) {
  Generator gen(12);
  for (DType dt : kAllDTypes) {
    for (int64_t n : kSizes) {
      Tensor want;
      Tensor in = random_cuda(n, dt, gen, &want);
      const std::string what = detail::str(dtype_name(dt), " n=", n);
      if (dt != DType::kU16) {  // NCCL reduces no 16-bit unsigned type
        Tensor rs = poisoned_cuda({n}, dt);
        dp().reduce_scatter(in, rs, ReduceOp::kSum);
        expect_same_bits(want, rs, "reduce_scatter " + what);
      }
      Tensor ag = poisoned_cuda({n}, dt);
      dp().all_gather(in, ag);
      expect_same_bits(want, ag, "all_gather " + what);
      Tensor a2a = poisoned_cuda({n}, dt);
      dp().all_to_all(in, a2a);
      expect_same_bits(want, a2a, "all_to_all " + what);
      dp().broadcast(in, 0);
      expect_same_bits(want, in, "broadcast " + what);
    }
  }
}

// The input is written by a kernel on the compute stream just before the call: the NCCL stream
// must wait for it (a large fill takes long enough to be overtaken otherwise), and reads after
// wait() must see the result.
TEST_F(NcclSelfTest, OrderedAgainstTheComputeStream) {
  const int64_t n = int64_t{1} << 24;
  for (int i = 0; i < 3; ++i) {
    Tensor in = Tensor::full({n}, 1.0 + i, DType::kF32, Device::cuda(0));
    Tensor out = poisoned_cuda({n}, DType::kF32);
    WorkPtr w = dp().all_gather_async(in, out);
    w->wait();
    const Tensor host = out.to(Device::cpu());
    const float* p = host.data<float>();
    int64_t bad = 0;
    for (int64_t j = 0; j < n; ++j) bad += p[j] != static_cast<float>(1.0 + i);
    EXPECT_EQ(bad, 0) << "round " << i;
    EXPECT_TRUE(w->is_done());
  }
}

// Inputs dropped by the caller right after issue stay alive until NCCL is done with them: new
// allocations of the same size must not receive their memory early and overwrite them.
TEST_F(NcclSelfTest, KeepsTensorsAliveUntilComplete) {
  const int64_t n = (int64_t{1} << 22) + 5;
  Generator gen(13);
  std::vector<Tensor> wants, outs;
  std::vector<WorkPtr> works;
  for (int i = 0; i < 4; ++i) {
    Tensor want;
    Tensor in = random_cuda(n, DType::kF32, gen, &want);
    outs.push_back(poisoned_cuda({n}, DType::kF32));
    works.push_back(dp().all_gather_async(std::move(in), outs.back()));
    wants.push_back(want);
    Tensor clobber = Tensor::full({n}, -7.0, DType::kF32, Device::cuda(0));
  }
  for (size_t i = 0; i < works.size(); ++i) {
    works[i]->wait();
    expect_same_bits(wants[i], outs[i], detail::str("all_gather ", i));
  }
}

TEST_F(NcclSelfTest, ReportsEventsAndCompletes) {
  std::mutex mu;
  std::vector<CommEvent> events;
  dp().set_observer([&](const CommEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  });
  Tensor t = Tensor::ones({1001}, DType::kF32, Device::cuda(0));
  Tensor out = poisoned_cuda({1001}, DType::kF32);
  std::vector<WorkPtr> works = {dp().all_reduce_async(t, ReduceOp::kSum),
                                dp().all_gather_async(t, out)};
  for (auto& w : works) w->wait();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (events.size() >= 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  dp().set_observer({});
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].op, "all_reduce");
  EXPECT_EQ(events[1].op, "all_gather");
  for (const CommEvent& e : events) {
    EXPECT_EQ(e.group, "dp");
    EXPECT_EQ(e.bytes, 1001 * 4);
    EXPECT_LE(e.queued, e.finished);
    EXPECT_LE(e.started, e.finished);
  }
  for (auto& w : works) EXPECT_TRUE(w->is_done());
}

TEST_F(NcclSelfTest, CpuTensorsGoToTheHostCommunicator) {
  Tensor t = Tensor::full({5}, 2.5, DType::kF32);
  Tensor out = Tensor::zeros({5}, DType::kF32);
  ctx_->world().all_reduce(t, ReduceOp::kMax);
  ctx_->world().all_gather(t, out);
  for (double v : out.to_vector()) EXPECT_EQ(v, 2.5);
  ctx_->world().barrier();
}

TEST_F(NcclSelfTest, RejectsBadArguments) {
  Tensor f = Tensor::ones({6}, DType::kF32, Device::cuda(0));
  Tensor i = Tensor::ones({6}, DType::kI32, Device::cuda(0));
  Tensor u = Tensor::ones({6}, DType::kU16, Device::cuda(0));
  EXPECT_THROW(dp().all_reduce(i, ReduceOp::kAvg), Error);
  EXPECT_THROW(dp().all_reduce(u, ReduceOp::kSum), Error);
  EXPECT_THROW(dp().all_gather(f, Tensor::ones({6}, DType::kF32)), Error);  // cuda → cpu
  EXPECT_THROW(dp().all_gather(f, Tensor::ones({7}, DType::kF32, Device::cuda(0))), Error);
  EXPECT_THROW(dp().all_to_all(f, f), Error);  // overlapping
  EXPECT_THROW(dp().broadcast(f, 1), Error);
  EXPECT_THROW(dp().send(f, 0), Error);
  EXPECT_THROW(dp().recv(f, 0), Error);
  EXPECT_THROW(dp().all_reduce(Tensor::ones({2, 3}, DType::kF32, Device::cuda(0)).transpose(0, 1),
                               ReduceOp::kSum),
               Error);
  // The communicator is still usable after rejected calls.
  dp().all_reduce(f, ReduceOp::kSum);
  expect_same_bits(Tensor::ones({6}, DType::kF32), f, "all_reduce after errors");
}

}  // namespace
}  // namespace loom::cuda_test
