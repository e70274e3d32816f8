// tests/parallel/comm/cuda_comm_mpi_test.cpp — CUDA tensors under mpirun: MpiCommunicator
// staging them through pinned host memory (CudaStaging.*, on 3 ranks: every rank may share one
// GPU; results equal the same operation on CPU tensors bit for bit), and the NCCL communicators
// of a CUDA ParallelContext (NcclMpi.*, on 2 ranks: rank r on GPU local_rank; results against
// references computed locally from every member's regenerated input). Each test skips, with the
// reason, at the other world size, when the build has no CUDA or the machine too few GPUs (all
// ranks of one node skip alike).
// loom-mpi-test: ranks 2 3
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/registry.h"
#include "parallel/comm/communicator.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel {
namespace {

using testing::member_input;
using testing::same_bits;
using testing::world_rank;
using testing::world_size;

// Empty when this rank can use `needed` GPUs on its node; else why not.
std::string no_gpu_reason(int needed) {
  if (!kernels::Registry::instance().has("device_count", DeviceType::kCuda)) {
    return "this build has no CUDA backend (configured with LOOM_CUDA=OFF)";
  }
  const int gpus = device_count(DeviceType::kCuda);
  if (gpus < needed) {
    return detail::str(gpus, " GPUs visible, ", needed, " needed (one per rank for NCCL)");
  }
  return "";
}

int local_rank() {
  MPI_Comm node = MPI_COMM_NULL;
  int r = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r;
}

Tensor poisoned(const Shape& shape, DType dtype, Device device) {
  const double poison = dtype == DType::kF32 || dtype == DType::kF64
                            ? std::numeric_limits<double>::quiet_NaN()
                            : 77.0;
  return Tensor::full(shape, poison, dtype, device);
}

const DType kDTypes[] = {DType::kF32, DType::kF64, DType::kI32, DType::kI64};

// The world size each suite runs at (the file declares both; the other suite skips itself):
// staging with an odd world whose ranks share the GPUs, NCCL with one GPU per rank.
constexpr int kStagingRanks = 3;
constexpr int kNcclRanks = 2;

// ---- MpiCommunicator with CUDA tensors -------------------------------------------------------

class CudaStaging : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world_size() != kStagingRanks) GTEST_SKIP() << "runs at " << kStagingRanks << " ranks";
    const std::string reason = no_gpu_reason(1);
    if (!reason.empty()) GTEST_SKIP() << "no CUDA device: " << reason;
    gpu_ = Device::cuda(local_rank() % device_count(DeviceType::kCuda));
  }
  Device gpu_;
};

// Every collective on CUDA copies of the inputs gives the bits of the same collective on the
// CPU tensors (same communicator, same rank-order reduction).
TEST_F(CudaStaging, CollectivesMatchCpu) {
  ParallelContext ctx = ParallelContext::create(testing::test_layouts()[0]);
  Communicator& c = ctx.world();
  const int n = c.size(), me = c.rank();
  uint64_t salt = 500;
  for (DType dt : kDTypes) {
    for (int64_t len : {int64_t{0}, int64_t{1}, int64_t{17}, 7 * int64_t{n} + 3, int64_t{300007}}) {
      ++salt;
      const std::string what = detail::str(dtype_name(dt), " len=", len);
      const Tensor x = member_input(me, salt, {len}, dt);
      const Tensor big = member_input(me, salt + 7777, {len * n}, dt);

      Tensor cpu = x.clone(), gpu = x.to(gpu_);
      c.all_reduce(cpu, ReduceOp::kSum);
      c.all_reduce(gpu, ReduceOp::kSum);
      EXPECT_TRUE(same_bits(cpu, gpu.to(Device::cpu()))) << "all_reduce " << what;

      Tensor rs_cpu = poisoned({len}, dt, Device::cpu()), rs_gpu = poisoned({len}, dt, gpu_);
      c.reduce_scatter(big, rs_cpu, ReduceOp::kMax);
      c.reduce_scatter(big.to(gpu_), rs_gpu, ReduceOp::kMax);
      EXPECT_TRUE(same_bits(rs_cpu, rs_gpu.to(Device::cpu()))) << "reduce_scatter " << what;

      Tensor ag_cpu = poisoned({len * n}, dt, Device::cpu()),
             ag_gpu = poisoned({len * n}, dt, gpu_);
      c.all_gather(x, ag_cpu);
      c.all_gather(x.to(gpu_), ag_gpu);
      EXPECT_TRUE(same_bits(ag_cpu, ag_gpu.to(Device::cpu()))) << "all_gather " << what;

      Tensor a2a_cpu = poisoned({len * n}, dt, Device::cpu()),
             a2a_gpu = poisoned({len * n}, dt, gpu_);
      c.all_to_all(big, a2a_cpu);
      c.all_to_all(big.to(gpu_), a2a_gpu);
      EXPECT_TRUE(same_bits(a2a_cpu, a2a_gpu.to(Device::cpu()))) << "all_to_all " << what;

      Tensor b_gpu = x.to(gpu_);
      c.broadcast(b_gpu, n - 1);
      EXPECT_TRUE(same_bits(member_input(n - 1, salt, {len}, dt), b_gpu.to(Device::cpu())))
          << "broadcast " << what;
    }
  }
}

// A ring of send_async + recv_async with CUDA tensors (MPI semantics: cannot deadlock).
TEST_F(CudaStaging, SendRecvRing) {
  ParallelContext ctx = ParallelContext::create(testing::test_layouts()[0]);
  Communicator& c = ctx.world();
  const int n = c.size(), me = c.rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int64_t len = 100003;
  const Tensor mine = member_input(me, 900, {len}, DType::kF32);
  Tensor got = poisoned({len}, DType::kF32, gpu_);
  WorkPtr s = c.send_async(mine.to(gpu_), (me + 1) % n, 3);
  WorkPtr r = c.recv_async(got, (me + n - 1) % n, 3);
  s->wait();
  r->wait();
  EXPECT_TRUE(
      same_bits(member_input((me + n - 1) % n, 900, {len}, DType::kF32), got.to(Device::cpu())));
}

// ---- NcclCommunicator under mpirun ------------------------------------------------------------

class NcclMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world_size() != kNcclRanks) GTEST_SKIP() << "runs at " << kNcclRanks << " ranks";
    const std::string reason = no_gpu_reason(world_size());
    if (!reason.empty()) GTEST_SKIP() << "no NCCL run: " << reason;
    ParallelOptions opts = testing::test_layouts()[0];
    opts.device = DeviceType::kCuda;
    ctx_ = std::make_unique<ParallelContext>(ParallelContext::create(opts));
  }
  std::unique_ptr<ParallelContext> ctx_;
};

// ‖got − want‖ / ‖want‖ (NCCL's summation order is its own, Note [NCCL determinism]).
double rel_error(const Tensor& want, const Tensor& got) {
  const auto a = want.to_vector(), b = got.to(Device::cpu()).to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(b[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += a[i] * a[i];
  }
  return den == 0 ? (num == 0 ? 0 : std::numeric_limits<double>::infinity()) : std::sqrt(num / den);
}

TEST_F(NcclMpi, ContextUsesTheLocalGpu) { EXPECT_EQ(ctx_->device(), Device::cuda(local_rank())); }

// f32 tolerance 1e-5 relative (DESIGN §3); max and data movement exact.
TEST_F(NcclMpi, CollectivesMatchTheirDefinitions) {
  Communicator& c = ctx_->world();
  const Device gpu = ctx_->device();
  const int n = c.size(), me = c.rank();
  uint64_t salt = 700;
  for (int64_t len : {int64_t{1}, int64_t{17}, 7 * int64_t{n} + 3, int64_t{1000003}}) {
    ++salt;
    const DType dt = DType::kF32;
    Tensor sum = Tensor::zeros({len}, DType::kF64), max = member_input(0, salt, {len}, dt);
    for (int r = 0; r < n; ++r) {
      const std::vector<double> v = member_input(r, salt, {len}, dt).to_vector();
      const std::vector<double> m = max.to_vector();
      std::vector<double> s = sum.to_vector(), mx(m.size());
      for (size_t i = 0; i < v.size(); ++i) {
        s[i] += v[i];
        mx[i] = std::max(m[i], v[i]);
      }
      sum = Tensor::from_vector(s, {len});
      max = Tensor::from_vector(mx, {len}).to(dt);
    }
    Tensor t = member_input(me, salt, {len}, dt).to(gpu);
    c.all_reduce(t, ReduceOp::kSum);
    EXPECT_LE(rel_error(sum, t), 1e-5) << "all_reduce sum len=" << len;
    t = member_input(me, salt, {len}, dt).to(gpu);
    c.all_reduce(t, ReduceOp::kAvg);
    std::vector<double> avg = sum.to_vector();
    for (double& v : avg) v /= n;
    EXPECT_LE(rel_error(Tensor::from_vector(avg, {len}), t), 1e-5) << "all_reduce avg len=" << len;
    t = member_input(me, salt, {len}, dt).to(gpu);
    c.all_reduce(t, ReduceOp::kMax);
    EXPECT_TRUE(same_bits(max, t.to(Device::cpu()))) << "all_reduce max len=" << len;

    Tensor ag = poisoned({len * n}, dt, gpu);
    c.all_gather(member_input(me, salt, {len}, dt).to(gpu), ag);
    const Tensor ag_host = ag.to(Device::cpu());
    for (int r = 0; r < n; ++r) {
      const Tensor want = member_input(r, salt, {len}, dt);
      EXPECT_EQ(std::memcmp(want.raw_data(),
                            static_cast<const char*>(ag_host.raw_data()) + r * want.nbytes(),
                            want.nbytes()),
                0)
          << "all_gather chunk " << r << " len=" << len;
    }

    Tensor rs = poisoned({len}, dt, gpu);
    c.reduce_scatter(member_input(me, salt + 1, {len * n}, dt).to(gpu), rs, ReduceOp::kSum);
    std::vector<double> rs_want(static_cast<size_t>(len), 0.0);
    for (int r = 0; r < n; ++r) {
      const std::vector<double> v = member_input(r, salt + 1, {len * n}, dt).to_vector();
      for (int64_t i = 0; i < len; ++i) rs_want[i] += v[me * len + i];
    }
    EXPECT_LE(rel_error(Tensor::from_vector(rs_want, {len}), rs), 1e-5)
        << "reduce_scatter len=" << len;

    Tensor a2a = poisoned({len * n}, dt, gpu);
    c.all_to_all(member_input(me, salt + 2, {len * n}, dt).to(gpu), a2a);
    const Tensor a2a_host = a2a.to(Device::cpu());
    for (int r = 0; r < n; ++r) {
      const Tensor from_r = member_input(r, salt + 2, {len * n}, dt);
      const size_t chunk = static_cast<size_t>(len) * 4;
      EXPECT_EQ(std::memcmp(static_cast<const char*>(from_r.raw_data()) + me * chunk,
                            static_cast<const char*>(a2a_host.raw_data()) + r * chunk, chunk),
                0)
          << "all_to_all chunk from " << r << " len=" << len;
    }

    Tensor b = member_input(me, salt + 3, {len}, dt).to(gpu);
    c.broadcast(b, n - 1);
    EXPECT_TRUE(same_bits(member_input(n - 1, salt + 3, {len}, dt), b.to(Device::cpu())))
        << "broadcast len=" << len;
  }
}

// A ring of separate calls: even ranks send first, odd ranks receive first (NCCL p2p needs the
// cycle broken, see nccl_communicator.h; the grouped form is the next test); with 1 rank
// nothing to do.
TEST_F(NcclMpi, SendRecvRing) {
  Communicator& c = ctx_->world();
  const int n = c.size(), me = c.rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int64_t len = 1 << 20;
  const Tensor mine = member_input(me, 950, {len}, DType::kF32);
  Tensor got = poisoned({len}, DType::kF32, ctx_->device());
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  if (me % 2 == 0) {
    c.send_async(mine.to(ctx_->device()), next, 0);
    c.recv_async(got, prev, 0)->wait();
  } else {
    WorkPtr r = c.recv_async(got, prev, 0);
    c.send_async(mine.to(ctx_->device()), next, 0);
    r->wait();
  }
  EXPECT_TRUE(same_bits(member_input(prev, 950, {len}, DType::kF32), got.to(Device::cpu())));
  c.barrier();
}

// Both directions of a ring at once, as one group (ncclGroupStart/End): every rank sends to
// both neighbours before either receive, which separate NCCL calls would deadlock on.
TEST_F(NcclMpi, SendRecvGroupBothDirections) {
  Communicator& c = ctx_->world();
  const int n = c.size(), me = c.rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int64_t len = (1 << 20) + 3;
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const Tensor a = member_input(me, 960, {len}, DType::kBF16),
               b = member_input(me, 961, {len}, DType::kBF16);
  Tensor from_prev = poisoned({len}, DType::kBF16, ctx_->device());
  Tensor from_next = poisoned({len}, DType::kBF16, ctx_->device());
  std::vector<WorkPtr> w = c.send_recv_async(
      {P2P::send(a.to(ctx_->device()), next, 0), P2P::send(b.to(ctx_->device()), prev, 0),
       P2P::recv(from_prev, prev, 0), P2P::recv(from_next, next, 0)});
  ASSERT_EQ(w.size(), 4u);
  for (WorkPtr& x : w) x->wait();
  EXPECT_TRUE(same_bits(member_input(prev, 960, {len}, DType::kBF16), from_prev.to(Device::cpu())));
  EXPECT_TRUE(same_bits(member_input(next, 961, {len}, DType::kBF16), from_next.to(Device::cpu())));
  c.barrier();
}

// CPU tensors given to an NCCL group go over MPI, with MPI's rank-order sum.
TEST_F(NcclMpi, CpuTensorsUseTheHostCommunicator) {
  Communicator& c = ctx_->dp();
  Tensor t = Tensor::full({3}, 1.0 + c.rank(), DType::kF64);
  c.all_reduce(t, ReduceOp::kSum);
  const double want = c.size() * (c.size() + 1) / 2.0;
  for (double v : t.to_vector()) EXPECT_EQ(v, want);
}

}  // namespace
}  // namespace loom::parallel
