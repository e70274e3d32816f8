// parallel/tp/comm_ops.h — Megatron's matched communication ops for tensor and sequence
// parallelism, as autograd ops: each forward collective has its conjugate in backward.
//
//   op                      forward                         backward
//   copy_to_region          identity                        all-reduce (sum)
//   reduce_from_region      all-reduce (sum)                identity
//   scatter_to_region       keep this rank's chunk of dim   all-gather along dim
//   gather_from_region      all-gather along dim            keep this rank's chunk of dim
//   gather_from_sequence    all-gather along dim            reduce-scatter along dim
//   reduce_scatter_to_seq.  reduce-scatter along dim        all-gather along dim
//
// Chunks are equal and in group-rank order; `dim` must divide by the group size (checked).
// The group is the TP communicator of a ParallelContext, which must outlive the autograd graph.
// Collectives run blocking on the calling thread, in program order on every rank (forward in
// the model's order, backward in the engine's deterministic order), so no rank can disagree on
// the sequence of collectives. These ops move data only; they never touch parameters.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::tp {

Tensor copy_to_region(const Tensor& x, Communicator& group);
Tensor reduce_from_region(const Tensor& x, Communicator& group);
Tensor scatter_to_region(const Tensor& x, Communicator& group, int64_t dim);
Tensor gather_from_region(const Tensor& x, Communicator& group, int64_t dim);
Tensor gather_from_sequence(const Tensor& x, Communicator& group, int64_t dim);
Tensor reduce_scatter_to_sequence(const Tensor& x, Communicator& group, int64_t dim);

// The plain (non-autograd) collectives the ops are built from, for code that needs them
// outside a graph (e.g. vocab-parallel statistics). Results are fresh contiguous tensors.
Tensor all_reduce_sum(const Tensor& x, Communicator& group);
Tensor all_gather_dim(const Tensor& x, Communicator& group, int64_t dim);
Tensor reduce_scatter_dim(const Tensor& x, Communicator& group, int64_t dim);
Tensor chunk_dim(const Tensor& x, Communicator& group, int64_t dim);

}  // namespace loom::parallel::tp
