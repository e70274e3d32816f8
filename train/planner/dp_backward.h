// train/planner/dp_backward.h — the data-parallel gradient sync of ZeRO stages 0–2 in the
// step-time model (Note [Step-time model] in train/planner/step_time.h): the last micro-batch's
// backward filling the buckets, each reduced on the dp·cp group's link as it fills, and the
// context-parallel ring's hops, which share that link.
//
// Note [Buckets on the link]: backward runs the head and loss first, then the blocks in reverse.
// Stages 0–1 on a host with overlap (Note [Early contributions and sparse rows] in
// parallel/dp/data_parallel.h) reduce the vocabulary table's dense gradient — a tied table's
// head contribution, or an untied head's own — as soon as the head's backward ends, in a bucket
// of its own (elsewhere an untied head's gradient fills the first bucket then, and a tied table's
// is complete only at the end, with its lookup's); the table's lookup gradient (and any other tall
// table's) is reduced by rows at the end of backward (priced apart: its collectives and
// Calibration::table_rows). The blocks' gradients fill buckets of parallel.bucket_mb in backward
// order, each launched when full; what is left (the embedding side's) launches at the end. The link
// carries one collective at a time, in launch order. A context-parallel rank's ring (cp > 1) passes
// its K,V and gradient hops to members of the same dp·cp group: measured on a CPU (a cp 2 rank's
// trace, `train --profile`), a block's first backward hop issued while the table's 25.7 MB
// all-reduce was under way finished only with it, 5–11 ms later — so each block's ring waits, after
// the compute before its first hop, for the collectives launched before it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "train/config.h"

namespace loom::planner {

struct BackwardShape {
  double head_bwd = 0;     // the head and loss's backward, first (0 off the last stage)
  int64_t blocks = 0;      // this rank's blocks, one after another
  double block_bwd = 0;    // one block's backward, its tp and cp collectives included
  double before_ring = 0;  // of it, the compute before the ring's first hop
  double block_bytes = 0;  // one block's gradient bytes
  double head_bytes = 0;   // gradient bytes complete when the head's backward ends (buckets)
  double end_bytes = 0;    // gradient bytes complete at the end of backward
  double early_bytes = 0;  // a table's dense gradient, complete when the head's backward ends
  double bucket_bytes = 0;
  bool overlap = true;      // false: every bucket launched after backward
  bool ring_waits = false;  // cp > 1: each block's ring queues behind the link's collectives
};

struct BackwardSync {
  double exposed = 0;    // the buckets' collectives past the end of backward
  double ring_wait = 0;  // the ring's hops waiting behind buckets (on the critical path)
  double busy = 0;       // the link's time on buckets in all
};

// A tall table reduced by rows at the end of backward: rows × cols on this rank, `used` of its
// rows non-zero on some member (at most the step's tokens, or positions), `early` its dense part
// added then.
struct RowsTable {
  int64_t rows = 0, cols = 0, used = 0;
  bool early = false;
};

// Where the embedding tables' and the head's gradients go on a rank of cfg's layout (ZeRO 0–2,
// one pipeline stage's tables; `tokens` the step's over the dp·cp group, `grad_bytes` per
// element). Bytes per rank (÷ tp: the vocabulary-parallel tables).
struct TableSync {
  double covered = 0;           // the gradient bytes of the parameters placed here
  double head_bytes = 0;        // complete when the head's backward ends, into the buckets
  double early_bytes = 0;       // the same, in a bucket of its own (stages 0–1 on a host)
  double end_bytes = 0;         // into the buckets at the end of backward
  std::vector<RowsTable> rows;  // and reduced by rows after it
};
TableSync table_sync(const Config& cfg, int64_t tokens, double grad_bytes);

// `reduce(bytes)`: one bucket's collective, seconds.
BackwardSync simulate_backward_sync(const BackwardShape& s,
                                    const std::function<double(double)>& reduce);

}  // namespace loom::planner
