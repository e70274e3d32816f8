// parallel/diloco/options.h — DiLoCo's options (config parallel.diloco.*; train/config.cpp maps
// the keys onto this struct) and their checks against the rest of the layout (docs/parallel.md,
// "DiLoCo"; the scheme: Note [DiLoCo] in parallel/diloco/diloco_engine.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::parallel::diloco {

struct DilocoOptions {
  int64_t islands = 0;  // islands of the job at its start; 0: DiLoCo off
  int64_t island = 0;   // this island's id, 0..islands−1 (each island is its own launch)
  // A directory every island's ranks can read and write (local disk for islands on one
  // machine, NFS or Lustre across machines): the rendezvous and the quorums (Note [Quorum] in
  // parallel/diloco/island_link.h). One per job.
  std::string rendezvous;
  std::string address;             // this host's address for the inter-island TCP links; "": found
  int64_t inner_steps = 100;       // H: inner steps between two syncs of a fragment
  std::string outer = "nesterov";  // nesterov | sgd (momentum) | average
  double outer_lr = 0.7;           // DiLoCo's defaults (arXiv 2311.08105)
  double outer_momentum = 0.9;
  int64_t fragments = 1;                   // P: Streaming DiLoCo's fragments, strided over blocks
  int64_t overlap_steps = 0;               // τ: inner steps a fragment's exchange overlaps
  double fragment_alpha = 0.0;             // α: merged = α·local + (1 − α)·outer
  std::string quantize = "none";           // none | int8 | int4: the outer gradients sent
  std::string quantize_scaling = "block";  // block | row: one scale per block or per row
  int64_t quantize_block = 128;            // elements per scale (block scaling)
  bool error_feedback = true;              // quantisation error carried to the next sync
  int64_t lanes = 0;                       // ranks of an island that exchange; 0: all of them
  double quorum_timeout_s = 30;            // how long a quorum waits for an island it expects
  double join_timeout_s = 600;             // how long a (re)starting island waits to be let in

  bool on() const { return islands > 0; }
  int bits() const { return quantize == "int8" ? 8 : quantize == "int4" ? 4 : 0; }
};

// What DiLoCo must agree with in the rest of the config.
struct DilocoLayout {
  int64_t world = 1;  // ranks of one island (dp·pp·cp·tp)
  int64_t steps = 0;  // train.steps
  bool sdp = false;
};

// Throws ConfigError naming the parallel.diloco key when the options do not fit.
void validate(const DilocoOptions& o, const DilocoLayout& layout);

// Elements [begin, end) of a whole flattened parameter that belong to `fragment`.
struct FragmentRange {
  int64_t fragment = 0, begin = 0, end = 0;
};

// Note [Fragments]: Streaming DiLoCo's fragments. A block's parameters belong to fragment
// block mod P (strided over the blocks, as the paper's); every other parameter (the token and
// position tables, the final norm, an untied head) is cut by rows into P near-equal parts, part
// f in fragment f: a small model's vocabulary table holds most of its weights, and whole it
// would make one fragment several times the others (and the peak bandwidth with it). `block`:
// −1 outside the blocks.
std::vector<FragmentRange> fragment_ranges(int64_t block, const Shape& shape, int64_t fragments);

// Whether fragment f starts a sync after the run's step `step` (1-based): at the steps
// f·H/P + k·H (k ≥ 0, and step > 0), so with P = 1 every H steps.
bool syncs_at(const DilocoOptions& o, int64_t step, int64_t fragment);

}  // namespace loom::parallel::diloco
