// parallel/comm/communicator.h — the communicator interface: one instance per process group
// (a mesh dimension's group, a MiCS partition or replica group). Every collective has an
// asynchronous form returning a Work handle; the blocking form waits on it. Backends:
// MpiCommunicator (CPU tensors, and CUDA tensors staged through the host,
// parallel/comm/mpi_communicator.h) and, with the CUDA build, NcclCommunicator (CUDA tensors,
// parallel/comm/nccl_communicator.h). Ops on one communicator must be issued in the same order on
// every member.
//
// Note [Deterministic reductions]: reductions combine the members' contributions in rank
// order, never in arrival order, so a run is bit-reproducible for a given world size. (NCCL
// reduces in its own fixed order per topology instead: Note [NCCL determinism].)
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom::parallel {

enum class ReduceOp { kSum, kAvg, kMax };

// Seconds an operation may take, from being issued, before wait() throws: LOOM_COMM_TIMEOUT_S
// when set (a positive number; anything else is a ConfigError naming it), else 300.
double default_comm_timeout_s();

// A pending operation. wait() blocks until it completes (rethrowing its error, or throwing
// when it exceeds the communicator's timeout, naming the operation and the group) — for CPU
// tensors. For CUDA tensors on an NcclCommunicator, wait() instead makes the calling thread's
// compute stream wait for the operation and returns without blocking the host (Note [NCCL
// streams and Work] in parallel/comm/nccl_communicator.h).
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_done() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// Events a communicator reports to an observer (the profiler trace, the overlap statistics,
// and the tests that prove a reduction started before backward ended).
struct CommEvent {
  std::string group;  // communicator name
  std::string op;     // "all_reduce", "reduce_scatter", …
  int64_t bytes = 0;
  std::chrono::steady_clock::time_point queued, started, finished;
};

// Receives every operation's event once it finishes. Runs on the communicator's own thread
// (MpiCommunicator: before the operation's Work reports done; NcclCommunicator: its watchdog,
// shortly after the GPU finished it): keep it short and thread-safe.
using CommObserver = std::function<void(const CommEvent&)>;

// One transfer of a point-to-point group (Communicator::send_recv_async).
struct P2P {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  Tensor tensor;  // sent from, or received into (preallocated)
  int peer = -1;
  int tag = 0;
  static P2P send(Tensor t, int dst, int tag) { return {Kind::kSend, std::move(t), dst, tag}; }
  static P2P recv(Tensor t, int src, int tag) { return {Kind::kRecv, std::move(t), src, tag}; }
};

class OneSidedWindow;  // parallel/comm/one_sided.h

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // within this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // e.g. "dp", "tp", "mics_partition"
  // Installs (or, with an empty function, removes) the observer. Backends that report no
  // events keep this default, which throws.
  virtual void set_observer(CommObserver observer) {
    (void)observer;
    LOOM_FAIL("communicator ", name(), ": this backend does not report CommEvents");
  }

  // All tensors are contiguous and on the communicator's device; `out` is preallocated.
  // In place: t ← reduce over members of t.
  virtual WorkPtr all_reduce_async(Tensor t, ReduceOp op) = 0;
  // in (size·n) → out (n): this rank's chunk (chunks in rank order) of the reduction.
  virtual WorkPtr reduce_scatter_async(Tensor in, Tensor out, ReduceOp op) = 0;
  // in (n) → out (size·n): every member's in, concatenated in rank order.
  virtual WorkPtr all_gather_async(Tensor in, Tensor out) = 0;
  // in (size·n) → out (size·n): chunk j of in goes to member j; chunk i of out came from i.
  virtual WorkPtr all_to_all_async(Tensor in, Tensor out) = 0;
  virtual WorkPtr broadcast_async(Tensor t, int root) = 0;
  virtual WorkPtr send_async(Tensor t, int dst, int tag) = 0;
  virtual WorkPtr recv_async(Tensor t, int src, int tag) = 0;
  virtual WorkPtr barrier_async() = 0;
  // Issues the transfers as one group: they progress together, so a group may send to and
  // receive from the same peers in any order without deadlocking, also on a backend that runs
  // point-to-point operations one after another in issue order (NCCL: one
  // ncclGroupStart/End). Between two members, messages still match in issue order. Returns
  // one Work per transfer, in order (on NCCL they complete together). This default posts each
  // with send_async / recv_async: a group for backends whose posted transfers never wait for
  // one another (MPI).
  virtual std::vector<WorkPtr> send_recv_async(std::vector<P2P> ops) {
    std::vector<WorkPtr> works;
    for (P2P& op : ops) {
      works.push_back(op.kind == P2P::Kind::kSend
                          ? send_async(std::move(op.tensor), op.peer, op.tag)
                          : recv_async(std::move(op.tensor), op.peer, op.tag));
    }
    return works;
  }

  void all_reduce(Tensor t, ReduceOp op) { all_reduce_async(std::move(t), op)->wait(); }
  void reduce_scatter(Tensor in, Tensor out, ReduceOp op) {
    reduce_scatter_async(std::move(in), std::move(out), op)->wait();
  }
  void all_gather(Tensor in, Tensor out) {
    all_gather_async(std::move(in), std::move(out))->wait();
  }
  void all_to_all(Tensor in, Tensor out) {
    all_to_all_async(std::move(in), std::move(out))->wait();
  }
  void broadcast(Tensor t, int root) { broadcast_async(std::move(t), root)->wait(); }
  void send(Tensor t, int dst, int tag = 0) { send_async(std::move(t), dst, tag)->wait(); }
  void recv(Tensor t, int src, int tag = 0) { recv_async(std::move(t), src, tag)->wait(); }
  void barrier() { barrier_async()->wait(); }

  // Note [Communicator capabilities]: what some backends can do beyond the collectives, asked of
  // the interface (never by casting to a backend). A backend without one keeps the default,
  // which throws naming the group and what it lacks.
  // A communicator over `members` (ranks of this group, ascending), made by the members only
  // (collective over them); `tag` keeps concurrent creations apart. MPI: MPI_Comm_create_group.
  virtual std::unique_ptr<Communicator> subgroup(const std::vector<int>& members,
                                                 const std::string& name, double timeout_s,
                                                 int tag);
  // A window of `numel` elements of `dtype` on every member, zeroed, for one-sided transfers
  // (parallel/comm/one_sided.h); collective over the group. MPI: RMA (mpi_window.cpp).
  virtual std::unique_ptr<OneSidedWindow> one_sided_window(int64_t numel, DType dtype,
                                                           std::string name, double timeout_s);

  // Seconds callers have spent blocked in wait() on this communicator's operations since it
  // was made (host time: MpiCommunicator counts them; a GPU backend's wait does not block the
  // host and adds nothing). Tensor- and context-parallel layers wait on the compute thread, so
  // for those groups this is the compute thread's exposed communication (Note [Exposed comm]
  // in train/train_step.cpp).
  double waited_s() const { return static_cast<double>(waited_ns_->load()) * 1e-9; }

 protected:
  // Shared with the backend's Work objects, which may outlive the communicator.
  std::shared_ptr<std::atomic<int64_t>> waited_ns_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace loom::parallel
