// kernels/host_staging.h — page-locked ("pinned") host buffers and transfers between a device
// tensor and such a buffer, for code that must move device tensors through host memory without
// including a device runtime (the MPI communicator stages CUDA tensors this way, Note [Staging
// CUDA tensors] in parallel/comm/mpi_communicator.cpp). Registered by the CUDA backend only;
// nothing here is needed for CPU tensors.
#pragma once

#include <cstddef>

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
