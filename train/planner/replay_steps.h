// train/planner/replay_steps.h — the replay's smallest shared steps (Note [Memory timeline] in
// train/planner/memory.h): a parameter's cast under mixed precision, a weight gradient landing
// as .grad or in a buffer, a kept op's results under selective recompute. Used by replay.cpp,
// tp_replay.cpp and the other replays.
#pragma once

#include <cstdint>
#include <vector>

#include "core/checkpoint.h"
#include "core/error.h"
#include "train/planner/replay.h"

namespace loom::planner::steps {

using Id = ByteTimeline::Id;

inline bool mixed(const ReplayShape& s) { return s.w != 0 && s.w != s.e; }

// A parameter's compute-dtype cast for one use (mixed precision), or nothing.
inline Id param_cast(ByteTimeline& tl, const ReplayShape& s, int64_t elements) {
  return mixed(s) ? tl.alloc(elements * s.e) : 0;
}
inline void drop(ByteTimeline& tl, Id id) {
  if (id) tl.free(id);
}

// A weight's gradient `g` (compute dtype, on the timeline) leaving its node: kept as .grad or
// added into an existing buffer. Mixed precision: cast back to the master's by the cast's
// backward first.
inline void land_weight_grad(ByteTimeline& tl, const ReplayShape& s, ReplayGrads& grads, Id g,
                             int64_t elements) {
  if (mixed(s)) tl.replace(g, elements * s.w);
  if (s.keep_weight_grads) {
    grads.kept.push_back(g);
  } else {
    tl.free(g);
  }
}
inline void weight_grad(ByteTimeline& tl, const ReplayShape& s, ReplayGrads& grads,
                        int64_t elements) {
  land_weight_grad(tl, s, grads, tl.alloc(elements * s.e), elements);
}

// An op whose `count` results core/checkpoint.cpp's kept_or_computed produces: `compute`
// allocates them (and frees its temporaries) and returns their handles. In a selective region
// that keeps `kind` (`tape` non-null), recording, the tape shares each result; replaying, each
// result is a share of the tape's next handle and nothing is computed (Note [Selective
// recompute] in core/checkpoint.h).
template <class Compute>
std::vector<Id> kept_or_computed(ByteTimeline& tl, KeptResults* tape, KeptOp kind, size_t count,
                                 const Compute& compute) {
  if (!tape || !(tape->keep & kept_bit(kind))) return compute();
  std::vector<Id> results;
  if (!tape->replaying) {
    results = compute();
    for (Id id : results) tape->ids.push_back(tl.share(id));
  } else {
    for (size_t i = 0; i < count; ++i) {
      LOOM_CHECK(tape->next < tape->ids.size(), "memory replay: more kept results recomputed");
      results.push_back(tl.share(tape->ids[tape->next++]));
    }
  }
  LOOM_CHECK(results.size() == count, "memory replay: a kept op's results miscounted");
  return results;
}
// The same for an op of one result.
template <class Compute>
Id kept_or_computed(ByteTimeline& tl, KeptResults* tape, KeptOp kind, const Compute& compute) {
  return kept_or_computed(tl, tape, kind, 1, [&] { return std::vector<Id>{compute()}; })[0];
}

}  // namespace loom::planner::steps
