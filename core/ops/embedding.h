// core/ops/embedding.h — differentiable embedding lookup (gradient to the table only).
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// out[…, :] = weight[ids[…], :]. ids: any shape, dtype i32/i64/u16/u32, every id in [0, V)
// (otherwise an error naming the id and V); weight (V, C) floating. Returns ids.shape + (C).
// Backward sums the output gradient into the rows of weight, repeated ids accumulating.
Tensor embedding(const Tensor& ids, const Tensor& weight);

}  // namespace loom::ops
