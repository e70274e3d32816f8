// parallel/tp/cross_entropy.h — vocab-parallel softmax cross-entropy: the loss of logits whose
// vocabulary dimension is split across the tensor-parallel group (the output of a
// column-parallel LM head), without ever gathering the full logits. Each rank reduces its
// columns to per-row statistics (Note [Vocab-parallel cross-entropy kernels] in
// kernels/cross_entropy.h); only (N)-sized vectors cross the group.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::tp {

// logits_local (…, Vp/tp): this rank's columns [rank·Vp/tp, (rank+1)·Vp/tp) of the padded
// vocabulary Vp; targets (…) global ids or ignore_index; vocab_size ≤ Vp real columns (the
// rest are padding, left out of the softmax). Returns the mean loss over non-ignored rows, a
// 0-d tensor equal on every rank to softmax_cross_entropy of the gathered logits. Backward
// gives each rank the gradient of its own columns. Every rank of `group` must call it.
Tensor vocab_parallel_cross_entropy(const Tensor& logits_local, const Tensor& targets,
                                    int64_t ignore_index, int64_t vocab_size, Communicator& group);

}  // namespace loom::parallel::tp
