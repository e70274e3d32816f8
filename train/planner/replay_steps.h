// train/planner/replay_steps.h — the replay's smallest shared steps (Note [Memory timeline] in
// train/planner/memory.h): a parameter's cast under mixed precision, a weight gradient landing
// as .grad or in a buffer. Used by replay.cpp, tp_replay.cpp and the other replays.
#pragma once

#include <cstdint>

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

}  // namespace loom::planner::steps
