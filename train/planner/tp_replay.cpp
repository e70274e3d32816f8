// train/planner/tp_replay.cpp — tensor parallelism's layers on the byte counter (see
// train/planner/tp_replay.h).
#include "train/planner/tp_replay.h"

#include <vector>

#include "train/planner/replay_steps.h"

namespace loom::planner::tp {

using namespace steps;  // NOLINT(build/namespaces): the replay's shared steps

// Rows of the residual stream: B·T, or B·T/tp under sequence parallelism.
int64_t stream_rows(const ReplayShape& s) { return s.sp ? s.B * s.T / s.tp : s.B * s.T; }

// A parameter every TP rank holds whole, used on sequence chunks (norms, row layers' biases):
// through copy_to_region, a copy (of the cast, under mixed precision) the op may keep, and in
// backward a gradient all-reduced into a fresh tensor. Without SP: the cast, if any.
Id replicated_use(ByteTimeline& tl, const ReplayShape& s, int64_t elements) {
  if (!s.sp) return param_cast(tl, s, elements);
  const Id cast = param_cast(tl, s, elements);
  const Id copy = tl.alloc(elements * s.e);
  drop(tl, cast);
  return copy;
}
void replicated_grad(ByteTimeline& tl, const ReplayShape& s, ReplayGrads& grads, int64_t elements) {
  if (!s.sp) return weight_grad(tl, s, grads, elements);
  const Id g = tl.alloc(elements * s.e), sum = tl.alloc(elements * s.e);
  tl.free(g);
  land_weight_grad(tl, s, grads, sum, elements);
}

// ColumnParallelLinear under SP (parallel/tp/layers.cpp): forward, a ring all-gather of the
// input chunks, each multiplied (+ bias) as it passes, then concatenated to all rows.
Id column_forward_sp(ByteTimeline& tl, const ReplayShape& s, int64_t in, int64_t out, bool bias,
                     KeptResults* tape) {
  const int64_t rows = stream_rows(s), e = s.e;
  return kept_or_computed(tl, tape, KeptOp::kMatmul, [&] {
    std::vector<Id> parts;
    Id held = 0;  // the last received chunk
    for (int64_t step = 0; step < s.tp; ++step) {
      const Id next = step < s.tp - 1 ? tl.alloc(rows * in * e) : 0;
      Id part = tl.alloc(rows * out * e);
      if (bias) {
        tl.replace(part, rows * out * e);
      }
      parts.push_back(part);
      if (next) {
        drop(tl, held);
        held = next;
      }
    }
    drop(tl, held);
    const Id y = tl.alloc(s.B * s.T * out * e);
    for (Id p : parts) tl.free(p);
    return y;
  });
}
// Backward: the input all-gathered again, dX over all rows reduce-scattered (its send buffer a
// copy), the gathered chunks concatenated for dW. Returns this rank's dX rows; the caller frees
// the saved input, the cast and the incoming gradient.
Id column_backward_sp(ByteTimeline& tl, const ReplayShape& s, ReplayGrads& grads, int64_t in,
                      int64_t out, bool bias) {
  const int64_t N = s.B * s.T, e = s.e;
  const Id gathered = tl.alloc(N * in * e), dx_full = tl.alloc(N * in * e);
  const Id send = tl.alloc(N * in * e), dx = tl.alloc(stream_rows(s) * in * e);
  const Id x_full = tl.alloc(N * in * e);
  weight_grad(tl, s, grads, out * in);
  if (bias) weight_grad(tl, s, grads, out);
  for (Id id : {x_full, send, dx_full, gathered}) tl.free(id);
  return dx;
}
// RowParallelLinear under SP: forward, a ring reduce-scatter — each chunk's rows of the input
// copied (B > 1) and multiplied, the partial sum received added, the result sent on (kept until
// the sends complete); then GPT-2's bias through copy_to_region. Returns (B, T/tp, C).
Id row_forward_sp(ByteTimeline& tl, const ReplayShape& s, int64_t in, KeptResults* tape) {
  const int64_t rows = stream_rows(s), e = s.e, C = s.C;
  Id y = kept_or_computed(tl, tape, KeptOp::kMatmul, [&] {
    std::vector<Id> sent;
    Id incoming = 0, sum = 0;
    for (int64_t step = 0; step < s.tp; ++step) {
      const Id copy = s.B > 1 ? tl.alloc(rows * in * e) : 0;
      Id part = tl.alloc(rows * C * e);
      drop(tl, copy);
      if (step > 0) {
        tl.replace(part, rows * C * e);
      }
      if (step < s.tp - 1) {
        const Id buffer = tl.alloc(rows * C * e);
        drop(tl, incoming);
        incoming = buffer;
        sent.push_back(part);
      } else {
        sum = part;
      }
    }
    for (Id p : sent) tl.free(p);
    drop(tl, incoming);
    return sum;
  });
  if (!s.llama) {
    const Id b = replicated_use(tl, s, C), with_bias = tl.alloc(rows * C * e);
    tl.free(y);
    tl.free(b);
    y = with_bias;
  }
  return y;
}
// Backward: a ring all-gather of dY, each chunk's dX rows and its dW term (the input's rows
// copied when B > 1) while the next travels, the dW terms summed, dX concatenated. The caller
// frees the saved input and the cast; the incoming dY is the caller's.
Id row_backward_sp(ByteTimeline& tl, const ReplayShape& s, ReplayGrads& grads, int64_t in) {
  const int64_t rows = stream_rows(s), e = s.e, C = s.C;
  std::vector<Id> dx_parts;
  Id held = 0, dw = 0;
  for (int64_t step = 0; step < s.tp; ++step) {
    const Id next = step < s.tp - 1 ? tl.alloc(rows * C * e) : 0;
    dx_parts.push_back(tl.alloc(rows * in * e));
    const Id copy = s.B > 1 ? tl.alloc(rows * in * e) : 0;
    const Id d = tl.alloc(C * in * e);
    drop(tl, copy);
    if (dw) {
      const Id sum = tl.alloc(C * in * e);
      tl.free(dw);
      tl.free(d);
      dw = sum;
    } else {
      dw = d;
    }
    if (next) {
      drop(tl, held);
      held = next;
    }
  }
  drop(tl, held);
  const Id dx = tl.alloc(s.B * s.T * in * e);
  for (Id p : dx_parts) tl.free(p);
  land_weight_grad(tl, s, grads, dw, C * in);
  return dx;
}

// A RowParallelLinear's forward without sequence parallelism (parallel/tp/layers.cpp): the rows
// in two halves, each a contiguous copy of the input's half (when B > 1) multiplied while the
// previous half's all-reduce runs, then concatenated; GPT-2's bias is added outside the layer's
// node (its cast, under mixed precision, is the caller's). Returns the output (B, T, C).
Id row_forward(ByteTimeline& tl, const ReplayShape& s, int64_t in, KeptResults* tape) {
  const int64_t C = s.C, e = s.e, half = s.T / 2;
  Id y = kept_or_computed(tl, tape, KeptOp::kMatmul, [&] {
    if (s.tp == 1) return tl.alloc(s.B * s.T * C * e);  // one rank (a mesh for CP): one GEMM
    std::vector<Id> parts;
    for (int64_t len : {half, s.T - half}) {
      if (len == 0) continue;
      const Id copy = s.B > 1 ? tl.alloc(s.B * len * in * e) : 0;
      parts.push_back(tl.alloc(s.B * len * C * e));
      drop(tl, copy);
    }
    const Id out = tl.alloc(s.B * s.T * C * e);
    for (Id p : parts) tl.free(p);
    return out;
  });
  if (!s.llama) {  // ops::add(y, bias)
    tl.replace(y, s.B * s.T * C * e);
  }
  return y;
}

}  // namespace loom::planner::tp
