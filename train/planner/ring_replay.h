// train/planner/ring_replay.h — context parallelism's ring attention on the byte counter (Note
// [Memory timeline] in train/planner/memory.h): what parallel/cp/ring_attention.cpp allocates,
// keeps for backward and frees, for one block's attention on this rank's T/cp tokens.
#pragma once

#include "train/planner/replay.h"

namespace loom::planner {

// The forward: q's chunks packed (kept), k and v packed for the ring (a copy per hop, the last
// one freed at the end), the two output halves and their log-sum-exps (kept), a block buffer,
// the result (the caller's: it dies after the projection), and k and v packed once more (kept).
// Sets b.qc, b.kc (the packed k and v), b.att (the output halves), b.lse; returns the result.
// The output halves and log-sum-exps are kept results of `tape` (Note [Selective recompute] in
// core/checkpoint.h; null: none): replayed, the ring runs no hop.
ByteTimeline::Id ring_attention_forward(ByteTimeline& tl, const ReplayShape& s, BlockTape& b,
                                        KeptResults* tape);

// The backward, `incoming` the gradient arriving at the result (freed by the caller): its
// contiguous copy and chunks, the softmax deltas, dq and the travelling dk/dv accumulator (a
// buffer per hop), the k/v copies received, then dq, dk and dv whole; the saved tensors freed.
struct RingGrads {
  ByteTimeline::Id dq = 0, dk = 0, dv = 0;
};
RingGrads ring_attention_backward(ByteTimeline& tl, const ReplayShape& s, BlockTape& b);

}  // namespace loom::planner
