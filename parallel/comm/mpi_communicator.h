// parallel/comm/mpi_communicator.h — MpiCommunicator: the Communicator for CPU tensors over
// one MPI sub-communicator (and for CUDA tensors, staged through pinned host memory: Note
// [Staging CUDA tensors] in parallel/comm/mpi_communicator.cpp). It owns one worker thread that
// starts the queued operations in issue order with nonblocking MPI and polls them to completion, so
// collectives progress while the caller computes (see Note [MPI communicator thread]). It
// never reduces with MPI: reductions are sums in rank order done here (Note [Deterministic
// reductions]). It does not create the mesh's groups (ParallelContext does) and does not
// initialise MPI (launcher.h).
//
// Note [MPI communicator thread]: ops are started one at a time in issue order. A collective
// occupies the group until it completes (so every member starts its collectives in the same
// order); a send or recv is only posted and then polled alongside later ops, so a ring of
// send_async + recv_async cannot deadlock. The worker sleeps on a condition variable when it
// has nothing in flight and backs off (yield, then short sleeps) while polling MPI_Test.
// MPI must be initialised with MPI_THREAD_MULTIPLE (MpiRuntime does), since every
// communicator's thread calls MPI concurrently.
//
// Note [NCCL rules on MPI]: after follow_nccl_rules(), the communicator runs point-to-point
// transfers the way NcclCommunicator does on a GPU: every operation occupies the group until it
// completes (one at a time, in issue order), a send completes only once the peer's receive
// matched it (MPI_Issend), and a send_recv_async group is one operation whose transfers
// progress together. Code whose transfers would deadlock under NCCL (a send issued before a
// receive the peer needs first) then deadlocks here too — and fails with the timeout error
// naming the stuck operation — so the parallel layouts can be checked for NCCL safety on CPUs
// (`parallel.backend: mpi_nccl_rules`; ParallelOptions::nccl_rules). Results are unchanged.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/communicator.h"

namespace loom::parallel {

// Throws loom::Error "<where>: <call> failed: <MPI's message>" unless rc is MPI_SUCCESS: the one
// check of an MPI call's status, for every MPI user in parallel/.
void check_mpi(int rc, const char* call, const std::string& where);

class MpiOp;       // one queued operation (mpi_communicator.cpp)
class PinnedPool;  // host buffers for staged CUDA tensors (mpi_communicator.cpp)

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed by the destructor unless MPI is finalised by then).
  // Not collective. `name` labels errors and CommEvents ("dp", "tp", …).
  MpiCommunicator(MPI_Comm comm, std::string name, double timeout_s = default_comm_timeout_s());
  // A communicator over `members` (ranks of `parent`; member i becomes rank i). Collective
  // over the members only (MPI_Comm_create_group with `tag`); every member passes the same
  // list. The calling rank must be a member.
  static std::unique_ptr<MpiCommunicator> create(MPI_Comm parent, const std::vector<int>& members,
                                                 std::string name,
                                                 double timeout_s = default_comm_timeout_s(),
                                                 int tag = 0);
  // A duplicate of `parent` (MPI_Comm_dup: collective over all of parent).
  static std::unique_ptr<MpiCommunicator> duplicate(MPI_Comm parent, std::string name,
                                                    double timeout_s = default_comm_timeout_s());
  // Waits for every issued operation, but gives up on one that has run past the timeout, and
  // on all of them at once when destroyed during stack unwinding (an exception on this rank:
  // the peers may never match them, and the job is about to be aborted). Abandoned ops fail
  // with an error; their buffers and the MPI communicator are leaked, not freed under MPI.
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  void set_observer(CommObserver observer) override;
  double timeout_s() const { return timeout_s_; }
  MPI_Comm mpi_comm() const { return comm_; }
  // Capabilities (Note [Communicator capabilities] in parallel/comm/communicator.h):
  // MPI_Comm_create_group over the members (create); an RMA window (mpi_window.cpp).
  std::unique_ptr<Communicator> subgroup(const std::vector<int>& members, const std::string& name,
                                         double timeout_s, int tag) override {
    return create(comm_, members, name, timeout_s, tag);
  }
  std::unique_ptr<OneSidedWindow> one_sided_window(int64_t numel, DType dtype, std::string name,
                                                   double timeout_s) override;

  // Supported dtypes: reductions (all_reduce, reduce_scatter) f32, f64, bf16, f16, i32, i64
  // (kAvg: the floating ones; bf16/f16 reduced in f32 and rounded once); data movement (all_gather,
  // all_to_all, broadcast, send, recv) any dtype. Tensors must be contiguous, on the CPU or (in a
  // CUDA build) a GPU; a CUDA input is copied to the host before the call returns. Argument errors
  // throw here, at issue time.
  WorkPtr all_reduce_async(Tensor t, ReduceOp op) override;
  WorkPtr reduce_scatter_async(Tensor in, Tensor out, ReduceOp op) override;
  WorkPtr all_gather_async(Tensor in, Tensor out) override;
  WorkPtr all_to_all_async(Tensor in, Tensor out) override;
  WorkPtr broadcast_async(Tensor t, int root) override;
  WorkPtr send_async(Tensor t, int dst, int tag) override;
  WorkPtr recv_async(Tensor t, int src, int tag) override;
  WorkPtr barrier_async() override;
  // One MpiOp whose transfers progress together under NCCL rules; otherwise each transfer
  // posted on its own (Communicator's default).
  std::vector<WorkPtr> send_recv_async(std::vector<P2P> ops) override;
  // Note [NCCL rules on MPI]. Before the first operation only.
  void follow_nccl_rules();

 private:
  std::shared_ptr<MpiOp> make_p2p(const P2P& op);
  WorkPtr enqueue(std::shared_ptr<MpiOp> op);
  void worker_loop();
  bool take_startable(std::vector<std::shared_ptr<MpiOp>>& active,
                      std::vector<std::shared_ptr<MpiOp>>& to_start);
  void finish(MpiOp& op, std::exception_ptr error);
  void abandon(std::vector<std::shared_ptr<MpiOp>>& active);

  MPI_Comm comm_;
  std::string name_;
  double timeout_s_;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<PinnedPool> pinned_;  // staging buffers, shared with the ops that hold one

  std::mutex mutex_;  // guards everything below
  std::condition_variable cv_;
  std::deque<std::shared_ptr<MpiOp>> queue_;  // issued, not yet started
  CommObserver observer_;
  bool stop_ = false;
  bool abandon_now_ = false;  // destroyed while unwinding: do not wait for pending ops
  bool leaked_ = false;       // an op was abandoned: do not free comm_
  bool nccl_rules_ = false;   // Note [NCCL rules on MPI]
  std::thread worker_;        // started on the first operation
};

}  // namespace loom::parallel
