// train/planner/tp_replay.h — tensor parallelism's layers on the byte counter (Note [Memory
// timeline] in train/planner/memory.h): what parallel/tp/layers.cpp and parallel/tp/comm_ops.cpp
// allocate in a ColumnParallelLinear's and RowParallelLinear's forward and backward, with and
// without sequence parallelism, and the residual stream's rows.
#pragma once

#include <cstdint>

#include "train/planner/replay.h"

namespace loom::planner::tp {

using Id = ByteTimeline::Id;

// Rows of the residual stream: B·T, or B·T/tp under sequence parallelism.
int64_t stream_rows(const ReplayShape& s);
// A parameter every TP rank holds whole, used on sequence chunks (norms, row layers' biases):
// through copy_to_region, a copy (of the cast, under mixed precision) the op may keep; in
// backward its gradient all-reduced into a fresh tensor. Without SP: the cast, if any.
Id replicated_use(ByteTimeline& tl, const ReplayShape& s, int64_t elements);
void replicated_grad(ByteTimeline& tl, const ReplayShape& s, ReplayGrads& grads, int64_t elements);
// A row layer's forward without SP: two halves (each a contiguous copy of the input's half when
// B > 1, multiplied while the previous half's all-reduce runs), concatenated; GPT-2's bias added
// outside the node. One GEMM over one TP rank. Returns (B, T, C). Each layer's output before
// the bias added outside it is a kept result of `tape` (Note [Selective recompute] in
// core/checkpoint.h; null: none).
Id row_forward(ByteTimeline& tl, const ReplayShape& s, int64_t in, KeptResults* tape);
// Under SP: the column layer's ring all-gather forward (returns all rows, B·T × out) and its
// backward (returns this rank's dX rows); the row layer's ring reduce-scatter forward (returns
// B·T/tp × C) and its backward (returns dX over all rows). The callers free saved inputs, casts
// and incoming gradients.
Id column_forward_sp(ByteTimeline& tl, const ReplayShape& s, int64_t in, int64_t out, bool bias,
                     KeptResults* tape);
Id column_backward_sp(ByteTimeline& tl, const ReplayShape& s, ReplayGrads& grads, int64_t in,
                      int64_t out, bool bias);
Id row_forward_sp(ByteTimeline& tl, const ReplayShape& s, int64_t in, KeptResults* tape);
Id row_backward_sp(ByteTimeline& tl, const ReplayShape& s, ReplayGrads& grads, int64_t in);

}  // namespace loom::planner::tp
