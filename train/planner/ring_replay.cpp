// train/planner/ring_replay.cpp — ring attention on the byte counter (see
// train/planner/ring_replay.h).
#include "train/planner/ring_replay.h"

#include <vector>

#include "train/planner/replay_steps.h"

namespace loom::planner {

using Id = ByteTimeline::Id;

namespace {

// Bytes of the statistics (lse, delta): f32 for 16-bit compute.
int64_t stat_bytes(const ReplayShape& s) { return s.e == 8 ? 8 : 4; }

// k and v split into their chunks (two copies) and packed into one buffer.
Id pack_kv(ByteTimeline& tl, const ReplayShape& s) {
  const int64_t N = s.B * s.T;
  const Id k = tl.alloc(N * s.kv * s.e), v = tl.alloc(N * s.kv * s.e);
  const Id kv = tl.alloc(2 * N * s.kv * s.e);
  tl.free(k);
  tl.free(v);
  return kv;
}

}  // namespace

Id ring_attention_forward(ByteTimeline& tl, const ReplayShape& s, BlockTape& b, KeptResults* tape) {
  const int64_t N = s.B * s.T, e = s.e, rows = s.B * s.heads * s.T;
  b.qc = tl.alloc(N * s.q * e);
  Id kv = 0, block_out = 0, block_lse = 0;  // the ring's buffers, freed after the result
  const std::vector<Id> r = steps::kept_or_computed(tl, tape, KeptOp::kAttention, 2, [&] {
    kv = pack_kv(tl, s);
    const Id att = tl.alloc(N * s.q * e);           // the two output halves
    const Id lse = tl.alloc(rows * stat_bytes(s));  // and their log-sum-exps
    block_out = tl.alloc(N / 2 * s.q * e);
    block_lse = tl.alloc(rows / 2 * stat_bytes(s));
    for (int64_t step = 0; step + 1 < s.cp; ++step) {  // the next rank's k and v
      tl.replace(kv, 2 * N * s.kv * e);
    }
    return std::vector<Id>{att, lse};
  });
  b.att = r[0];
  b.lse = r[1];
  const Id result = tl.alloc(N * s.q * e);
  b.kc = pack_kv(tl, s);  // kept for backward
  for (Id id : {block_out, block_lse, kv}) {
    if (id) tl.free(id);
  }
  return result;
}

RingGrads ring_attention_backward(ByteTimeline& tl, const ReplayShape& s, BlockTape& b) {
  const int64_t N = s.B * s.T, e = s.e, rows = s.B * s.heads * s.T, sb = stat_bytes(s);
  const Id dres = tl.alloc(N * s.q * e);  // the strided incoming gradient, contiguous
  const Id dout = tl.alloc(N * s.q * e);  // split into chunks
  Id delta[2];
  for (Id& d : delta) {  // Σ dout·out per row, in the statistics dtype
    const Id a = sb != e ? tl.alloc(N / 2 * s.q * sb) : 0,
             o = sb != e ? tl.alloc(N / 2 * s.q * sb) : 0;
    const Id prod = tl.alloc(N / 2 * s.q * sb);
    d = tl.alloc(rows / 2 * sb);
    tl.free(prod);
    if (a) tl.free(a);
    if (o) tl.free(o);
  }
  const Id dq = tl.alloc(N * s.q * e);
  Id dkv = tl.alloc(2 * N * s.kv * e), kv = 0;
  for (int64_t step = 0; step < s.cp; ++step) {
    const Id next = step + 1 < s.cp ? tl.alloc(2 * N * s.kv * e) : 0;
    if (s.cp > 1) {  // the gradient accumulator travels on
      tl.replace(dkv, 2 * N * s.kv * e);
    }
    if (next) {
      if (kv) tl.free(kv);
      kv = next;
    }
  }
  RingGrads g;
  g.dq = tl.alloc(N * s.q * e);
  g.dk = tl.alloc(N * s.kv * e);
  g.dv = tl.alloc(N * s.kv * e);
  for (Id id : {dres, dout, delta[0], delta[1], dq, dkv}) tl.free(id);
  if (kv) tl.free(kv);
  tl.free(b.qc);  // the node's release
  tl.free(b.kc);
  tl.free(b.att);
  tl.free(b.lse);
  return g;
}

}  // namespace loom::planner
