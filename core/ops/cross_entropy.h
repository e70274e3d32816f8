// core/ops/cross_entropy.h — fused softmax cross-entropy, the language-model loss, as one
// differentiable op (Note [Cross-entropy kernel contract] in kernels/cross_entropy.h).
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// logits (..., Vp) float; targets (...) integer (i32, i64, u16, u32) with the same leading
// shape. Rows whose target equals ignore_index are skipped. vocab_size <= 0 means Vp; columns
// >= vocab_size are padding (left out of the softmax, zero gradient). Other targets must lie in
// [0, vocab_size). Returns the mean loss over non-ignored rows as a 0-d tensor (0, with zero
// gradient, when every row is ignored). Differentiable in logits.
// host_targets, when given, is a CPU tensor holding the same values as targets (e.g. the batch
// before it was copied to the device): they are counted and checked there, so a device run
// reads nothing back (Note [Cross-entropy count]).
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& targets,
                             int64_t ignore_index = -100, int64_t vocab_size = -1,
                             const Tensor& host_targets = {});

}  // namespace loom::ops
