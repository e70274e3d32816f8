// tests/parallel/mpi_test_main.cpp — main() of the MPI test binaries: initialises MPI through
// the launcher (run_main), runs the gtest cases on every rank, and prints only rank 0's
// progress (other ranks print their failures, prefixed with their rank). Also the fault
// modes the abort tests launch: `--loom-fault-test=MODE` makes rank 1 fail while the others
// wait in a collective, so the job ends only if run_main aborts it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "parallel/launcher.h"

namespace {

using loom::parallel::MpiRuntime;
using loom::parallel::ParallelContext;
using loom::parallel::ParallelOptions;
using loom::parallel::ReduceOp;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

int run_tests(int& argc, char** argv, MpiRuntime& runtime) {
  ::testing::InitGoogleTest(&argc, argv);
  if (runtime.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(runtime.rank()));
  }
  int failed = RUN_ALL_TESTS();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_failed;
}

// Rank 1 leaves an operation pending on its dp group that no peer matches, then fails;
// everyone else waits in a world barrier that rank 1 never reaches.
int fault_body(ParallelContext& ctx, const std::string& mode) {
  if (ctx.rank() == 1) {
    ctx.dp().all_reduce_async(loom::Tensor::ones({4}), ReduceOp::kSum);
    if (mode == "status") return 3;
    LOOM_FAIL("injected fault (", mode, ")");
  }
  ctx.world().barrier();
  return 0;
}

// throw:N, status:N — the run_main that builds the context (a dp=N layout); rank 1 throws,
// or returns status 3. unwind — the context lives inside the body and is destroyed while the
// exception unwinds (abandoning rank 1's pending operation).
int fault_main(int argc, char** argv, const std::string& mode) {
  const size_t colon = mode.find(':');
  if (colon != std::string::npos) {
    ParallelOptions opts;
    opts.shape.dp = std::stoi(mode.substr(colon + 1));
    opts.comm_timeout_s = 60;
    const std::string what = mode.substr(0, colon);
    return loom::parallel::run_main(argc, argv, opts,
                                    [&](ParallelContext& ctx) { return fault_body(ctx, what); });
  }
  return loom::parallel::run_main(argc, argv, [&](MpiRuntime& runtime) {
    ParallelOptions opts;
    opts.shape.dp = runtime.size();
    opts.comm_timeout_s = 60;
    ParallelContext ctx = ParallelContext::create(opts);
    return fault_body(ctx, mode);
  });
}

}  // namespace

int main(int argc, char** argv) {
  const char* kFlag = "--loom-fault-test=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], kFlag, std::strlen(kFlag)) == 0) {
      return fault_main(argc, argv, argv[i] + std::strlen(kFlag));
    }
  }
  return loom::parallel::run_main(
      argc, argv, [&](MpiRuntime& runtime) { return run_tests(argc, argv, runtime); });
}
