// core/ops/embedding.h — differentiable embedding lookup (gradient to the table only).
#pragma once

#include "core/tensor.h"

namespace loom::ops {

// out[…, :] = weight[ids[…], :]. ids: any shape, dtype i32/i64/u16/u32, every id in [0, V)
// (otherwise an error naming the id and V); weight (V, C) floating. Returns ids.shape + (C).
// Backward sums the output gradient into the rows of weight, repeated ids accumulating.
// ids may live on the host while weight is on a device: they are then checked on the host and
// uploaded, so the device kernels skip their own check and the host synchronisation it costs
// (kernels/embedding.h); ids on the device are checked there, one synchronisation per call,
// unless ids_checked says the caller guarantees them in [0, V) (ids it computed itself). The
// backward never checks again (the forward has).
Tensor embedding(const Tensor& ids, const Tensor& weight, bool ids_checked = false);

}  // namespace loom::ops
