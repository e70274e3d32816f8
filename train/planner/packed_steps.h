// train/planner/packed_steps.h — the steps a packed run (data.packing) will take, read from its
// data as the trainer will read it, and their compute priced per micro-batch (Note [Packed step
// time]): what the step-time model (train/planner/step_time.h) uses in place of a fixed
// micro-batch when the documents' lengths, and so the ranks' work, differ.
//
// Note [Packed step time]: every rank computes the whole step's plan from the data alone (Note
// [Packed steps] in data/packed_loader.h), so the planner can too: it runs the trainer's
// PackedLoader for each data rank (train/trainer.h packing_options: the same balance, budget and
// padding) over the run's first steps and keeps each micro-batch's documents and loss tokens. A
// micro-batch of L = Σ s_i input tokens and ℓ loss tokens costs the calibration's passes at a
// reference shape, one row of M tokens, scaled part by part:
//   block(mb) = (block_M − attention_M)·L/M + attention_M·Σ s_i²/M²
//   rest(mb)  = (rest_M − loss_M)·L/M + loss_M·ℓ/M
// The linears, norms and MLP are per token; the attention kernels skip the work outside each
// document (Note [Packed documents] in kernels/attention.h), so they cost Σ s_i² against the
// row's M²; the cross-entropy kernels skip an ignored target's row (SFT trains on the replies
// only), so the loss costs its loss tokens. M is the planned micro-batches' mean length rounded
// up to 64 tokens, not the budget: a pass's time per token is not constant over lengths (on the
// CPU test bed, per token, sft-tiny's head and loss cost 7 % more at 1024 tokens than at 576 and
// its blocks 16 % less), so the calibration is made where the micro-batches are. A padding
// micro-batch (ZeRO-3 with collectives: one ignored token) is priced as one token. The ranks then
// meet as the engine makes them:
//   sync at the end   (one process, DDP, ZeRO-1/2: the gradients' reduction after backward;
//                     ODC: its barriers) the step's compute is the slowest rank's sum;
//   sync per unit     (ZeRO-3 with collectives: every micro-batch's gathers join every rank)
//                     micro-batch m costs the slowest rank's m-th, summed over m.
// The mean over the planned steps is the figure; the step's tokens are the data's.
#pragma once

#include <cstdint>
#include <vector>

#include "train/config.h"
#include "train/planner/calibrate.h"

namespace loom::planner {

// One packed micro-batch: its documents' input lengths (a padding micro-batch: one document of 1
// token) and its loss tokens.
struct PackedMicroBatch {
  std::vector<int64_t> documents;
  int64_t loss_tokens = 0;
};
// One data rank's micro-batches of one step.
using RankMicroBatches = std::vector<PackedMicroBatch>;

struct PackedSteps {
  int64_t budget = 0;     // data.max_tokens_per_microbatch (or its default)
  int64_t reference = 0;  // M: the micro-batches' mean length, rounded up
  std::vector<std::vector<RankMicroBatches>> steps;  // [step][data rank]
  double tokens_per_step = 0;                        // mean input tokens of a step (every rank's)
};

// The first `steps` steps of the config's packed run on its data ranks (parallel.dp): its
// data.train shards opened as the trainer opens them (their errors name data.train).
// ZeRO-3 without ODC pads the ranks to equal micro-batch counts, as the engine asks.
PackedSteps plan_packed_steps(const Config& cfg, int64_t steps);

// The step's compute priced from the measured block, rest and attention at the reference shape
// (one row of plan.reference tokens), Note [Packed step time].
struct PackedCompute {
  double compute_s = 0;      // per step, mean: the model's passes as the ranks meet
  double micro_batches = 0;  // per step, mean, on the rank that sets the time
  PassTimes block, rest;     // one micro-batch's, mean over the planned ones
};
PackedCompute price_packed_steps(const PackedSteps& plan, int64_t n_layer, const PassTimes& block,
                                 const PassTimes& rest, const PassTimes& attention,
                                 const PassTimes& loss, bool sync_per_unit);

}  // namespace loom::planner
