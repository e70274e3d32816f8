// tests/parallel/single_process_test.cpp — the parts of parallel/ that run without mpirun:
// ParallelContext::single_process (every group the rank alone, collectives the identity),
// and the environment readers (LOOM_COMM_TIMEOUT_S, the launcher's local-rank variables).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/rng.h"
#include "parallel/comm/communicator.h"
#include "parallel/launcher.h"
#include "parallel/parallel_context.h"

namespace loom::parallel {
namespace {

// Sets an environment variable for the scope, restoring the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(SingleProcess, ContextHasEveryGroupOfSizeOne) {
  ParallelContext ctx = ParallelContext::single_process();
  EXPECT_EQ(ctx.world_size(), 1);
  EXPECT_EQ(ctx.rank(), 0);
  for (Communicator* c :
       {&ctx.world(), &ctx.dp(), &ctx.tp(), &ctx.pp(), &ctx.cp(), &ctx.group({kAxisMicsPartition}),
        &ctx.group({kAxisMicsReplica}), &ctx.group({kAxisDp, kAxisCp})}) {
    EXPECT_EQ(c->size(), 1) << c->name();
    EXPECT_EQ(c->rank(), 0) << c->name();
  }
  EXPECT_EQ(ctx.dp().name(), "dp");
  EXPECT_EQ(ctx.group({kAxisCp, kAxisDp}).name(), "dp_cp");
  EXPECT_THROW(ctx.group({"outer"}), Error);  // never created: named in the error
  EXPECT_EQ(ctx.dp_size() * ctx.tp_size() * ctx.pp_size() * ctx.cp_size(), 1);
}

TEST(SingleProcess, CollectivesAreTheIdentity) {
  ParallelContext ctx = ParallelContext::single_process();
  int events = 0;
  ctx.set_observer([&](const CommEvent& e) {
    ++events;
    EXPECT_EQ(e.group, "dp");
  });
  Generator gen(3);
  Tensor t = randn({7}, gen);
  const std::vector<double> before = t.to_vector();
  ctx.dp().all_reduce(t, ReduceOp::kAvg);
  EXPECT_EQ(t.to_vector(), before);
  Tensor out = Tensor::empty({7});
  ctx.dp().all_gather(t, out);
  EXPECT_EQ(out.to_vector(), before);
  Tensor rs = Tensor::empty({7});
  ctx.dp().reduce_scatter(t, rs, ReduceOp::kSum);
  EXPECT_EQ(rs.to_vector(), before);
  WorkPtr w = ctx.dp().barrier_async();
  EXPECT_TRUE(w->is_done());
  EXPECT_EQ(events, 4);
  EXPECT_THROW(ctx.dp().send(t, 0), Error);
  EXPECT_THROW(ctx.dp().broadcast(t, 1), Error);
}

// Without a usable GPU (or without CUDA in the build) a CUDA context is a clear error.
TEST(SingleProcess, CudaContextNeedsAGpu) {
  if (device_count(DeviceType::kCuda) > 0)
    GTEST_SKIP() << "a GPU is present (tests/cuda covers it)";
  try {
    ParallelContext::single_process(Device::cuda(0));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("cuda:0 is not available") != std::string::npos ||
                msg.find("this build has no CUDA") != std::string::npos)
        << msg;
  }
  EXPECT_EQ(ParallelContext::single_process().device(), Device::cpu());
}

TEST(SingleProcess, CommTimeoutComesFromEnvironment) {
  {
    ScopedEnv env("LOOM_COMM_TIMEOUT_S", "7.5");
    EXPECT_EQ(default_comm_timeout_s(), 7.5);
  }
  {
    ScopedEnv env("LOOM_COMM_TIMEOUT_S", "soon");
    try {
      default_comm_timeout_s();
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()),
                "LOOM_COMM_TIMEOUT_S: expected a positive number of seconds, got 'soon'");
    }
  }
  ScopedEnv env("LOOM_COMM_TIMEOUT_S", nullptr);
  EXPECT_EQ(default_comm_timeout_s(), 300.0);
}

TEST(SingleProcess, LocalRankFromLauncherEnvironment) {
  ScopedEnv a("OMPI_COMM_WORLD_LOCAL_RANK", nullptr), b("SLURM_LOCALID", nullptr),
      c("MPI_LOCALRANKID", nullptr), d("LOCAL_RANK", nullptr);
  EXPECT_EQ(local_rank_from_env(), -1);
  {
    ScopedEnv e("LOCAL_RANK", "3");
    EXPECT_EQ(local_rank_from_env(), 3);
    ScopedEnv f("SLURM_LOCALID", "2");  // srun's variable wins over the generic one
    EXPECT_EQ(local_rank_from_env(), 2);
  }
  ScopedEnv g("SLURM_LOCALID", "x");
  EXPECT_THROW(local_rank_from_env(), ConfigError);
}

}  // namespace
}  // namespace loom::parallel
