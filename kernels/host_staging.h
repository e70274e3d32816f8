// kernels/host_staging.h — page-locked ("pinned") host buffers and transfers between a device
// tensor and such a buffer, for code that must move device tensors through host memory without
// including a device runtime (the MPI communicator stages CUDA tensors this way, Note [Staging
// CUDA tensors] in parallel/comm/mpi_communicator.cpp; the trainer reads its step's numbers
// without waiting for the step, train/readback.h); and a gate that holds a device's compute
// stream until the host opens it, with which tests prove that a code path never waits for the
// device. Registered by the CUDA backend only; nothing here is needed for CPU tensors.
#pragma once

#include <cstddef>
#include <memory>

#include "kernels/registry.h"

// A pinned host buffer of `bytes` bytes (never null; throws when the allocation fails).
LOOM_DECLARE_KERNEL(pinned_host_alloc, void*(size_t bytes));
// Frees a buffer from pinned_host_alloc. Never throws (it runs from destructors); null is a no-op.
LOOM_DECLARE_KERNEL(pinned_host_free, void(void* ptr));
// dst_host[0, src.nbytes()) ← the contiguous device tensor src. Ordered after all work issued
// on the device's streams before the call (the copy runs on the legacy default stream) and
// complete when it returns.
LOOM_DECLARE_KERNEL(copy_device_to_pinned, void(const loom::Tensor& src, void* dst_host));
// The contiguous device tensor dst ← src_host[0, dst.nbytes()), complete when it returns (so
// the host buffer may be reused at once), ordered as copy_device_to_pinned.
LOOM_DECLARE_KERNEL(copy_pinned_to_device, void(const void* src_host, loom::Tensor& dst));

namespace loom::kernels {

// A transfer started by copy_device_to_pinned_async. wait() blocks until the bytes are in the
// host buffer (it may be called more than once); destroying it without waiting is allowed (the
// copy still completes, the buffer must outlive it: wait first when in doubt).
class HostCopy {
 public:
  virtual ~HostCopy() = default;
  virtual void wait() = 0;
};

}  // namespace loom::kernels

// Starts dst_host[0, src.nbytes()) ← the contiguous device tensor src on this thread's compute
// stream, behind the work already issued there, and returns without waiting. dst_host must be
// pinned (pinned_host_alloc) and stay alive, and src's memory unreused, until the copy is done:
// the caching allocator's stream order guarantees the latter for tensors freed after the call.
LOOM_DECLARE_KERNEL(copy_device_to_pinned_async,
                    std::unique_ptr<loom::kernels::HostCopy>(const loom::Tensor& src,
                                                             void* dst_host));

namespace loom::kernels {

// Returned by hold_compute_stream: open() lets the held stream go on (idempotent). Destroying it
// opens it and waits until the held kernel has finished.
class StreamGate {
 public:
  virtual ~StreamGate() = default;
  virtual void open() = 0;
};

}  // namespace loom::kernels

// Queues on this thread's compute stream of `device` a kernel that waits until the returned gate
// is opened from the host: the work queued after it cannot run before then. A host thread that
// waits for that work (a read-back, a synchronisation) therefore blocks until the gate is opened,
// which is how tests show that a code path does not wait for the device
// (tests/cuda/train_gpu_test.cpp).
LOOM_DECLARE_KERNEL(hold_compute_stream, std::unique_ptr<loom::kernels::StreamGate>(int device));
