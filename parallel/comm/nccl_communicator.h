// parallel/comm/nccl_communicator.h — NcclCommunicator: the Communicator for CUDA tensors, one
// ncclComm_t per process group on one GPU, every operation asynchronous on the communicator's
// own CUDA stream and ordered against the compute stream by events (Note [NCCL streams and
// Work]). CPU tensors passed to it go to its host communicator (the MPI one over the same
// members), so code that mixes host flags with device gradients can use one group object.
// This header includes no CUDA or NCCL header (the implementation is compiled only in CUDA
// builds); ParallelContext creates these communicators — it does not create groups itself.
//
// Note [NCCL streams and Work]: `*_async` records an event on the calling thread's compute
// stream (kernels::cuda::compute_stream()) at issue time, makes the communicator's stream wait
// for it, enqueues the NCCL call there and records a completion event after it. So an
// operation sees every kernel the calling thread issued on the tensor's device before the
// call, and nothing issued after it. The returned Work:
//   * wait(): makes the *calling thread's* compute stream wait for the completion event and
//     returns at once — it does not block the host. Kernels issued after wait() see the
//     result; the host sees it after any later blocking read (e.g. tensor.to(cpu), which is
//     ordered after the compute stream). It throws when the operation failed or timed out.
//   * is_done(): the completion event has been reached (cudaEventQuery), or the op failed.
// The communicator keeps every operation's tensors alive until its completion event is reached
// (whether or not the Work is kept), so the caching allocator cannot hand their memory to other
// work while NCCL still reads or writes it. synchronize() blocks the host until every issued
// operation has completed.
//
// Note [NCCL determinism]: NCCL's reductions are not rank-ordered sums like MpiCommunicator's
// (Note [Deterministic reductions]); they follow the algorithm (ring or tree) and channel
// layout NCCL chooses for the topology, message size and NCCL_* environment. For a fixed
// machine, world size, message size and environment that choice — and so the summation order —
// is fixed, so results are reproducible run to run, but they differ in rounding from the MPI
// backend and between topologies. kAvg is ncclAvg (for floating types NCCL multiplies each
// contribution by 1/n and sums — a premultiplied sum, not sum-then-divide — on the device).
//
// Timeouts: a watchdog thread per communicator polls the pending operations' events and
// ncclCommGetAsyncError. When an operation has been pending for longer than the timeout since it
// was issued, or NCCL reports an asynchronous error, it prints the operation and group to
// stderr ("collective all_reduce on group dp (4 ranks) did not complete within 5 s"), aborts
// the NCCL communicator (ncclCommAbort, which ends the stuck kernels) and fails every pending
// operation; from then on every CUDA operation and barrier on the communicator throws that
// error (the group is unusable; the job should end). The watchdog also reports CommEvents and
// releases tensors. Creation is covered only up to the id broadcast (the host communicator's
// timeout): a member that never reaches ncclCommInitRank leaves the others blocked in it.
//
// send/recv: NCCL matches a send with the peer's recv on the GPU, and one communicator's
// operations run in issue order on its stream. Unlike MpiCommunicator, a cycle of sends each
// issued before the matching recv (e.g. every rank of a ring calling send_async then
// recv_async) therefore deadlocks unless NCCL can buffer the messages: issue the transfers
// that must progress together as one send_recv_async group (a ring step, an exchange), and
// order the groups the same way on every member (the pipeline: Note [Communication order] in
// parallel/pp/simulate.h).
#pragma once

#include <memory>
#include <string>

#include "parallel/comm/communicator.h"

namespace loom::parallel {

class NcclCommunicator final : public Communicator {
 public:
  // A communicator over the members of `host` (same ranks, same order) on GPU `device_index`
  // (one GPU per member: NCCL refuses two members on one GPU). Collective over the members:
  // member 0 creates the ncclUniqueId and broadcasts it through `host` (a CPU tensor), then
  // every member joins the NCCL communicator. `host` also serves CPU tensors afterwards. A
  // group of one may pass a null host (no bootstrap, no MPI needed; CPU tensors are then
  // refused); its NCCL communicator is created on the first operation. `name` labels errors
  // and CommEvents.
  NcclCommunicator(std::string name, int device_index, std::unique_ptr<Communicator> host,
                   double timeout_s = default_comm_timeout_s());
  // Waits for the issued operations (up to the timeout), then destroys the NCCL communicator
  // and the stream. While unwinding (an exception on this rank) it aborts the NCCL
  // communicator instead of waiting, and leaks the pending operations' tensors (the GPU may
  // still touch them). Never throws.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const std::string& name() const override;
  // CommEvents (from the watchdog thread, after the operation's completion event, so possibly
  // after is_done() turned true): started/finished are the GPU start and end of the operation
  // as the watchdog saw them (within its ~1 ms polling). Also installed on the host
  // communicator, when there is one.
  void set_observer(CommObserver observer) override;
  int device_index() const;
  double timeout_s() const;
  // Blocks the host until every operation issued so far has completed; throws when one failed
  // or timed out.
  void synchronize();

  // CUDA tensors: contiguous, on this communicator's GPU. Reductions (all_reduce,
  // reduce_scatter): f32, f64, bf16, f16, i32, i64, u32 (kAvg floating only); data movement
  // (all_gather, all_to_all, broadcast, send, recv): any dtype, moved as bytes. all_to_all is
  // grouped send/recv (ncclGroupStart/End). send/recv tags are checked (0..32767) but not
  // matched: messages between two members match in issue order. CPU tensors go to the host
  // communicator. Argument errors throw here, at issue time.
  WorkPtr all_reduce_async(Tensor t, ReduceOp op) override;
  WorkPtr reduce_scatter_async(Tensor in, Tensor out, ReduceOp op) override;
  WorkPtr all_gather_async(Tensor in, Tensor out) override;
  WorkPtr all_to_all_async(Tensor in, Tensor out) override;
  WorkPtr broadcast_async(Tensor t, int root) override;
  WorkPtr send_async(Tensor t, int dst, int tag) override;
  WorkPtr recv_async(Tensor t, int src, int tag) override;
  // One ncclGroupStart/End around the transfers; all CUDA tensors or all CPU tensors (the
  // host communicator's group). One Work, shared by every transfer.
  std::vector<WorkPtr> send_recv_async(std::vector<P2P> ops) override;
  // The host communicator's barrier (a host-level barrier, as MpiCommunicator's); it does not
  // order GPU work. A group of one without a host completes at once.
  WorkPtr barrier_async() override;

 private:
  struct Impl;  // nccl_communicator.cpp
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::parallel
