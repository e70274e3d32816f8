// parallel/launcher.cpp — MPI initialisation and finalisation, launch information, and the
// job-wide abort on a failing rank. The only place Loom calls MPI_Init/MPI_Finalize/MPI_Abort.
// In a build without MPI (LOOM_MPI=OFF) the runtime is a world of one process.
#include "parallel/launcher.h"

#if LOOM_HAS_MPI
#include <mpi.h>
#endif

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <thread>

#include "core/error.h"

namespace loom::parallel {

namespace {

constexpr double kAbortGraceS = 3.0;  // how long MPI_Abort may take before the rank just exits

[[maybe_unused]] bool mpi_running() {
#if LOOM_HAS_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
#else
  return false;
#endif
}

int world_size_now() {
  int size = 1;
#if LOOM_HAS_MPI
  if (mpi_running()) MPI_Comm_size(MPI_COMM_WORLD, &size);
#endif
  return size;
}

// "rank R (host H): message" — the host, so that a failure across hosts names where it was.
void print_rank_message(const std::string& message) {
  int rank = -1;
#if LOOM_HAS_MPI
  if (mpi_running()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
#endif
  char host[256] = "?";
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "?");
  std::fflush(stdout);
  const std::string who = rank >= 0 ? std::to_string(rank) : "?";
  std::fprintf(stderr, "rank %s (host %s): %s\n", who.c_str(), host, message.c_str());
  std::fflush(stderr);
}

// Runs fn; on an exception, aborts a multi-rank job, or reports and returns 1 in a one-rank
// job. Called where an exception can still be reported before any destructor might block.
int guarded(const std::function<int()>& fn) {
  std::string message;
  try {
    return fn();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown exception";
  }
  if (world_size_now() > 1) abort_job(message);
  print_rank_message(message);
  return 1;
}

#if LOOM_HAS_MPI
// Note [RMA component]: ODC's windows (parallel/comm/mpi_window.cpp) need an MPI one-sided
// component that serves them. On one host Open MPI's osc/sm always does; across hosts Open MPI
// 4.1 under MPI_THREAD_MULTIPLE picks by default a component that fails at MPI_Win_allocate
// (osc/pt2pt refuses multi-threaded use; osc/rdma needs a BTL with RDMA), and osc/ucx, which
// works over TCP as over InfiniBand, must be asked for. So, before MPI_Init, Loom asks for
// `sm,ucx` — unless the user chose (OMPI_MCA_osc set, as `mpirun --mca osc …` does), the MPI
// is not Open MPI, or Open MPI has no osc/ucx plugin in its plugin folder (a build without UCX:
// then the window's creation fails with a Loom error that says what to set). Non-ODC runs make
// no window, so the choice costs them nothing. The plugin folder is the one ompi_info named when
// the build was configured (CMakeLists.txt), or OPAL_PKGLIBDIR where Open MPI was moved.
void choose_rma_component() {
#if defined(OPEN_MPI) && OPEN_MPI && defined(LOOM_OMPI_PKGLIBDIR)
  if (std::getenv("OMPI_MCA_osc") != nullptr) return;
  // The plugin folder: Open MPI's own override (OPAL_PKGLIBDIR), else the build's (ompi_info).
  const char* env = std::getenv("OPAL_PKGLIBDIR");
  const std::filesystem::path dir = env != nullptr ? env : LOOM_OMPI_PKGLIBDIR;
  std::error_code ec;
  if (!dir.empty() && std::filesystem::exists(dir / "mca_osc_ucx.so", ec))
    setenv("OMPI_MCA_osc", "sm,ucx", 0);
#endif
}
#endif

}  // namespace

int local_rank_from_env() {
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    LOOM_CONFIG_CHECK(*end == '\0' && r >= 0, name, ": expected a non-negative integer, got '", v,
                      "'");
    return static_cast<int>(r);
  }
  return -1;
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  info_.env_local_rank = local_rank_from_env();
#if !LOOM_HAS_MPI
  (void)argc;
  (void)argv;
#else
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    choose_rma_component();  // Note [RMA component]
    LOOM_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS,
               "MPI_Init_thread failed");
    owns_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  LOOM_CHECK(provided == MPI_THREAD_MULTIPLE, "MPI provides thread level ", provided,
             ", Loom needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
             "): every communicator has its own thread");
  MPI_Comm_rank(MPI_COMM_WORLD, &info_.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &info_.world_size);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info_.world_rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &info_.local_rank);
  MPI_Comm_size(node, &info_.local_size);
  MPI_Comm_free(&node);
#endif
}

MpiRuntime::~MpiRuntime() {
#if LOOM_HAS_MPI
  if (owns_ && mpi_running()) MPI_Finalize();
#endif
}

void abort_job(const std::string& message, int exit_code) {
  print_rank_message(message);
#if LOOM_HAS_MPI
  if (mpi_running()) {
    // MPI_Abort asks the launcher to end every rank. Where the launcher cannot be reached (this
    // host's link is cut, mpirun's host is gone) it can block: this rank then ends anyway, so
    // no rank outlives its error by more than kAbortGraceS.
    std::thread([exit_code] {
      std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGraceS));
      std::_Exit(exit_code);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
#endif
  std::_Exit(exit_code);
}

int run_main(int argc, char** argv, const std::function<int(MpiRuntime&)>& body) {
  std::optional<MpiRuntime> runtime;
  const int init = guarded([&] {
    runtime.emplace(&argc, &argv);
    return 0;
  });
  if (init != 0) return init;
  const int status = guarded([&] { return body(*runtime); });
  if (status != 0 && runtime->size() > 1) {
    abort_job(detail::str("exited with status ", status), status);
  }
  return status;
}

int run_main(int argc, char** argv, const ParallelOptions& options,
             const std::function<int(ParallelContext&)>& body) {
  return run_main(argc, argv, [&](MpiRuntime& runtime) {
    ParallelContext ctx = ParallelContext::create(options);
    const int status = guarded([&] { return body(ctx); });
    // Checked while the context exists: its destructor would wait for pending operations.
    if (status != 0 && runtime.size() > 1) {
      abort_job(detail::str("exited with status ", status), status);
    }
    return status;
  });
}

}  // namespace loom::parallel
