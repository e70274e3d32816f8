// layers/dropout_key.h — DropoutKey: what a forward's residual dropouts are keyed by, so that a
// mask is a function of where an activation sits in the single process's step, never of a
// generator's history.
//
// Note [Dropout by coordinates]: the residual dropout `draw` (0: attention branch, 1: MLP
// branch) of block `layer` in micro-batch `micro` of optimizer step `step` keeps the activation
// element at (global batch row b, global position t, channel c) iff Note [Dropout mask]'s rule
// (kernels/dropout.h) holds for Philox key dropout_stream(key, layer, draw) at offset 0 and
// element i = (b·T + t)·C + c, T the whole sequence's length. Every layout derives its rows'
// coordinates — data parallelism its replica's batch rows (Block::set_batch_slice), context and
// sequence parallelism their positions (SequenceLayout::dropout_rows) — and so draws exactly
// the single process's masks; a pipeline stage, activation checkpointing's recomputation and a
// resumed run need no offset arithmetic and no saved generator state, only the step.
#pragma once

#include <cstdint>

namespace loom {

struct DropoutKey {
  uint64_t seed = 0;  // the run's (train.seed + 1)
  int64_t step = 0;   // the optimizer step, 0-based
  int64_t micro = 0;  // the micro-batch within the step
};

// The Philox key of one residual dropout: (seed, step, micro, layer, draw) mixed by splitmix64,
// so distinct tuples give unrelated streams.
inline uint64_t dropout_stream(const DropoutKey& k, int64_t layer, int draw) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(k.seed);
  for (uint64_t v : {static_cast<uint64_t>(k.step), static_cast<uint64_t>(k.micro),
                     static_cast<uint64_t>(layer), static_cast<uint64_t>(draw)}) {
    h = mix(h ^ v);
  }
  return h;
}

}  // namespace loom
