// parallel/comm/one_sided.h — OneSidedWindow: memory each member of a group exposes to the
// others for one-sided transfers (used by ODC, Note [ODC] in parallel/odc/odc_gatherer.h). A member
// reads a range of an owner's window (get) or adds a buffer into it (accumulate) without the owner
// making any call; the only synchronisation is flush (this rank's accumulates complete at their
// targets) and barrier (collective: everything flushed before it is visible to every member
// after it). Local operations act on the rank's own window between barriers. Backends: MPI RMA
// over the group's MPI communicator (Communicator::one_sided_window of an MpiCommunicator,
// parallel/comm/mpi_window.cpp, CPU tensors) and CUDA IPC between the GPUs
// of one node (make_cuda_ipc_window, CUDA tensors; compiled, not yet run). The interface knows
// nothing of parameters, units or optimisers; nothing here is a collective except creation, barrier
// and destruction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel {

class OneSidedWindow {
 public:
  virtual ~OneSidedWindow() = default;
  virtual int rank() const = 0;  // within the group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "odc params dp", for errors
  virtual int64_t numel() const = 0;            // elements each member exposes
  virtual DType dtype() const = 0;              // f32 or f64

  // One-sided and asynchronous; the owner makes no call. Tensors are contiguous, of the window's
  // dtype and device; [offset, offset + numel) must lie in the owner's window. The tensor is
  // kept alive until the Work is done.
  //   get_async:        dst ← owner[offset, offset + n); done: dst holds the values.
  //   accumulate_async: owner[offset, offset + n) += src, element-wise atomic with respect to
  //                     other accumulates; done: src may be reused (the sum reaches the owner
  //                     by the next flush()). Accumulates of one origin to one location apply
  //                     in issue order.
  virtual WorkPtr get_async(int owner, int64_t offset, Tensor dst) = 0;
  virtual WorkPtr accumulate_async(int owner, int64_t offset, Tensor src) = 0;
  // Completes at their targets every accumulate this rank issued.
  virtual void flush() = 0;
  // Collective over the group: what every member flushed, and wrote locally, before it is
  // visible to every member after it.
  virtual void barrier() = 0;

  // This rank's own window, between barriers (no member may be accumulating into the range).
  virtual void write_local(int64_t offset, const Tensor& src) = 0;
  virtual void zero_local(int64_t offset, int64_t n) = 0;
  // out (n) ← (Σ_{k < slots} local[offset + k·stride, + n), added in k order) / divisor, the
  // arithmetic of MpiCommunicator's rank-order reductions (a copy of slot 0, the other slots
  // added one by one, then one division; Note [Deterministic reductions]).
  virtual void reduce_local(int64_t offset, int64_t stride, int slots, double divisor,
                            const Tensor& out) = 0;
};

// A window over the GPUs of one node (CUDA IPC: Note [ODC over CUDA IPC] in
// parallel/comm/cuda_ipc_window.cpp), on device `device` of this rank, for CUDA tensors; `group`'s
// CPU path exchanges the IPC handles and runs the barrier. Accumulates are exact only into
// locations no other origin writes (per-origin slots). A build without CUDA throws. Compiled, never
// run.
std::unique_ptr<OneSidedWindow> make_cuda_ipc_window(Communicator& group, int64_t numel,
                                                     DType dtype, int device, std::string name);

// One Work for several: done when all are; wait() waits for each in order.
WorkPtr join_works(std::vector<WorkPtr> works);

}  // namespace loom::parallel
