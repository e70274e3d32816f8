// tests/parallel/context_mpi_test.cpp — ParallelContext under mpirun: every communicator's
// members (found by all-gathering world ranks through it) are the mesh's group, the rank
// accessors agree with the mesh, impossible layouts are ConfigErrors naming the key, and
// MpiRuntime reports the launch (world and node-local rank, the environment's local rank).
// loom-mpi-test: ranks 8
// loom-multihost-test: 2x4
// The abort tests also run this executable: under each fault mode of mpi_test_main.cpp rank 1
// fails while the others wait in a collective, and run_main must end the whole job promptly,
// non-zero, printing the rank's message.
// loom-mpi-abort-test: ranks 4 fault throw:4 expect rank 1 \(host [^)]+\): injected fault \(throw\)
// loom-mpi-abort-test: ranks 4 fault unwind expect rank 1 \(host [^)]+\): injected fault \(unwind\)
// loom-mpi-abort-test: ranks 3 fault status:3 expect rank 1 \(host [^)]+\): exited with status 3
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>

#include "parallel/launcher.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel {
namespace {

using testing::world_rank;
using testing::world_size;

TEST(Context, CommunicatorsHoldTheMeshGroups) {
  for (const ParallelOptions& opts : testing::test_layouts()) {
    ParallelContext ctx = ParallelContext::create(opts);
    SCOPED_TRACE(ctx.str());
    EXPECT_EQ(ctx.rank(), world_rank());
    EXPECT_EQ(ctx.world_size(), world_size());
    for (const MeshAxis& a : ctx.mesh().axes())
      EXPECT_EQ(ctx.axis_rank(a.name), ctx.mesh().coord(world_rank(), a.name)) << a.name;
    EXPECT_EQ(ctx.dp().rank(), ctx.dp_rank());
    EXPECT_EQ(ctx.tp().rank(), ctx.tp_rank());
    EXPECT_EQ(ctx.cp().rank(), ctx.cp_rank());
    EXPECT_EQ(ctx.pp().rank(), ctx.pp_rank());
    EXPECT_EQ(ctx.dp().size(), ctx.dp_size());
    EXPECT_EQ(ctx.tp().size(), ctx.tp_size());
    EXPECT_EQ(ctx.axis_size(kAxisMicsPartition) * ctx.axis_size(kAxisMicsReplica),
              ctx.dp_size() * ctx.cp_size());
    for (const auto& g : testing::groups_of(ctx, opts.mics_partition_size)) {
      const int k = g.comm->size();
      ASSERT_EQ(k, static_cast<int>(g.members.size())) << g.comm->name();
      EXPECT_EQ(g.members[static_cast<size_t>(g.comm->rank())], world_rank()) << g.comm->name();
      Tensor mine = Tensor::from_vector<int32_t>({world_rank()}, {1});
      Tensor all = Tensor::empty({k}, DType::kI32);
      g.comm->all_gather(mine, all);
      for (int i = 0; i < k; ++i) {
        EXPECT_EQ(all.data<int32_t>()[i], g.members[static_cast<size_t>(i)])
            << g.comm->name() << " member " << i;
      }
    }
  }
}

TEST(Context, ObserverIsInstalledOnEveryCommunicator) {
  ParallelContext ctx = ParallelContext::create(testing::test_layouts()[0]);
  std::vector<std::string> seen;
  std::mutex mu;
  ctx.set_observer([&](const CommEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(e.group);
  });
  for (Communicator* c : {&ctx.world(), &ctx.tp(), &ctx.cp(), &ctx.dp(), &ctx.pp(),
                          &ctx.group({kAxisMicsPartition}), &ctx.group({kAxisMicsReplica})}) {
    c->barrier();
  }
  const std::vector<std::string> want = {"world",          "tp",          "cp", "dp", "pp",
                                         "mics_partition", "mics_replica"};
  EXPECT_EQ(seen, want);
}

TEST(Context, ImpossibleLayoutsAreConfigErrors) {
  const int n = world_size();
  ParallelOptions too_many;
  too_many.shape.dp = n + 1;
  try {
    ParallelContext::create(too_many);
    ADD_FAILURE() << "layout accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(detail::str("does not equal the world size ", n)),
              std::string::npos)
        << e.what();
  }
  ParallelOptions mics;
  mics.shape.dp = n;
  mics.mics_partition_size = n + 1;
  try {
    ParallelContext::create(mics);
    ADD_FAILURE() << "partition accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(detail::str("parallel.mics_partition_size: ", n + 1,
                                                     " does not divide parallel.dp ", n)),
              std::string::npos)
        << e.what();
  }
  // The world is still usable: nothing collective was started by the failed creations.
  ParallelOptions ok;
  ok.shape.dp = n;
  ParallelContext ctx = ParallelContext::create(ok);
  ctx.world().barrier();
}

// This host's rank count as the launcher states it: mpirun's OMPI_COMM_WORLD_LOCAL_SIZE, or
// srun's SLURM_STEP_TASKS_PER_NODE ("2(x3),1": tasks per node, run-length coded) at SLURM_NODEID;
// 0 when neither is set.
int launcher_local_size() {
  if (const char* ompi = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::atoi(ompi);
  const char* per_node = std::getenv("SLURM_STEP_TASKS_PER_NODE");
  const char* node = std::getenv("SLURM_NODEID");
  if (per_node == nullptr || node == nullptr) return 0;
  int remaining = std::atoi(node);
  std::istringstream in(per_node);
  std::string run;
  while (std::getline(in, run, ',')) {
    const int tasks = std::atoi(run.c_str());
    const size_t times = run.find("(x");
    const int repeat = times == std::string::npos ? 1 : std::atoi(run.c_str() + times + 2);
    if (remaining < repeat) return tasks;
    remaining -= repeat;
  }
  return 0;
}

TEST(Launcher, LaunchInfoFromMpiAndEnvironment) {
  int argc = 0;
  char** argv = nullptr;
  MpiRuntime runtime(&argc, &argv);  // MPI is already initialised: reads the launch only
  const LaunchInfo& info = runtime.info();
  EXPECT_EQ(info.world_rank, world_rank());
  EXPECT_EQ(info.world_size, world_size());
  // The host's ranks from MPI's shared-memory split agree with the launcher's count: all of
  // them on one host, PPN of them across tools/cluster's hosts (multihost.parallel.context_2x4),
  // and under srun on the test bed's Slurm (multihost.slurm).
  const int local_size = launcher_local_size();
  EXPECT_EQ(info.local_size, local_size != 0 ? local_size : world_size());
  if (local_size == 0) {
    EXPECT_EQ(info.local_rank, world_rank());
  }
  if (std::getenv("OMPI_COMM_WORLD_LOCAL_RANK") != nullptr ||
      std::getenv("SLURM_LOCALID") != nullptr) {
    EXPECT_EQ(info.env_local_rank, info.local_rank);
  }
}

}  // namespace
}  // namespace loom::parallel
