// parallel/launcher.h — process start-up and shutdown under an MPI launcher (mpirun, or
// srun --mpi=pmix under Slurm): MpiRuntime initialises MPI with MPI_THREAD_MULTIPLE and
// finalises it (RAII), LaunchInfo says where this process sits (world and node-local rank),
// and abort_job/run_main turn an error on any one rank into a prompt, job-wide exit with
// the message, instead of the other ranks hanging in their next collective.
// Nothing here builds groups (ParallelContext does) or keeps global state.
#pragma once

#include <functional>
#include <string>

#include "parallel/parallel_context.h"

namespace loom::parallel {

struct LaunchInfo {
  int world_rank = 0;
  int world_size = 1;
  int local_rank = 0;  // among the ranks on this node (MPI_Comm_split_type SHARED)
  int local_size = 1;
  int env_local_rank = -1;  // what the launcher's environment said (local_rank_from_env)
};

// The node-local rank from the launcher's environment, usable before MPI is initialised (to
// pick a GPU): the first set of OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), SLURM_LOCALID (srun),
// MPI_LOCALRANKID (MPICH/Hydra), LOCAL_RANK; -1 when none is set.
int local_rank_from_env();

// Initialises MPI with MPI_THREAD_MULTIPLE (every communicator has its own thread calling
// MPI) and finalises it on destruction. When MPI is already initialised it only reads the
// launch information and leaves finalisation to whoever initialised it. Throws when MPI
// cannot provide MPI_THREAD_MULTIPLE. Destroy every ParallelContext before this.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  const LaunchInfo& info() const { return info_; }
  int rank() const { return info_.world_rank; }
  int size() const { return info_.world_size; }

 private:
  bool owns_ = false;
  LaunchInfo info_;
};

// Prints "rank R: <message>" to stderr (stdout flushed first) and ends the whole job:
// MPI_Abort(MPI_COMM_WORLD, exit_code) when MPI is running, else _Exit(exit_code).
[[noreturn]] void abort_job(const std::string& message, int exit_code = 1);

// The main of an MPI program: initialises MPI, runs `body`, finalises and returns its status.
// An exception escaping `body` on any rank — or a non-zero status on a multi-rank job, since
// its peers may be waiting for it — calls abort_job with the message, so mpirun exits
// non-zero at once. In a one-rank job the message is printed the same way and the status
// (1 for an exception) returned after a clean shutdown.
int run_main(int argc, char** argv, const std::function<int(MpiRuntime&)>& body);
// The same, with the ParallelContext built from `options` (layout errors abort likewise).
// Prefer this form: the exception or status is acted on while the context still exists. (A
// context created inside the first form's body is destroyed first: on an exception it
// abandons its pending operations at once, but after a non-zero return it waits for them,
// up to the communicator timeout.)
int run_main(int argc, char** argv, const ParallelOptions& options,
             const std::function<int(ParallelContext&)>& body);

}  // namespace loom::parallel
