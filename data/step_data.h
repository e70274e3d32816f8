// data/step_data.h — StepData: one optimizer step's data as this rank runs it, in the one form
// both kinds of training data fill — fixed-length windows (data/loader.h) and packed whole
// documents (data/packed_loader.h) — with what the loss and the log need of the whole step. The
// step sources (data/step_source.h) make it; the step runner (train/step_runner.h) runs it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace loom {

// One forward and backward of this rank: rows of input tokens and their targets.
struct MicroBatch {
  Tensor inputs;   // i32 (rows, L), CPU
  Tensor targets;  // i32 (rows, L), CPU: the next token, or -100 where it is not a loss token
  // Packed documents: positions (L) restarting at 0 for each document, and doc_start (L), the
  // row index where each token's document starts (Note [Attention kernel contract] in
  // kernels/attention.h); the row is run whole. Both undefined for windows: each row is one
  // sequence at positions 0 … L-1, of which the step runner takes this rank's part by the model's
  // sequence layout (Note [Model-parallel step] in train/step_runner.h).
  Tensor positions;
  Tensor doc_start;
  int64_t documents = 0;    // sequences in it (windows: its rows)
  int64_t loss_tokens = 0;  // targets that are not -100
  int64_t tokens() const { return inputs.defined() ? inputs.numel() : 0; }
};

// How a step's loss is made of its micro-batches' mean losses l_m (Note [Packed loss] in
// train/step_runner.h).
enum class StepLoss {
  // Windows: every target counts and every micro-batch holds as many, so the loss of a
  // data-parallel replica is the mean of its M micro-batches' l_m, and the step's the mean over
  // the replicas.
  kMean,
  // Documents: Σ over every rank's loss tokens of their cross-entropy / N, N the step's loss
  // tokens (global_loss_tokens): micro-batch m of c_m loss tokens weighs c_m / N.
  kTokens,
};

struct StepData {
  std::vector<MicroBatch> micro;  // this rank's, in order; at least one
  StepLoss loss = StepLoss::kMean;
  // Every rank's loss tokens; 0 (documents whose loss tokens were all cut or masked) leaves
  // nothing to learn: the trainer skips such a step (Note [Loss tokens and the cut] in
  // data/packed_loader.h).
  int64_t global_loss_tokens = 0;
  int64_t global_tokens = 0;  // input tokens of the whole step, every rank's
  // Documents: each data-parallel rank's input tokens and micro-batches (before padding), for the
  // log's balance; empty for windows (every rank reads as many).
  std::vector<int64_t> rank_tokens, rank_micro_batches;

  int64_t micro_batches() const { return static_cast<int64_t>(micro.size()); }
  // Micro-batch m's weight in this rank's share of the loss: kMean 1/M, kTokens c_m / N (N at
  // least 1).
  double weight(size_t m) const {
    if (loss == StepLoss::kMean) return 1.0 / static_cast<double>(micro_batches());
    return static_cast<double>(micro[m].loss_tokens) /
           static_cast<double>(std::max<int64_t>(global_loss_tokens, 1));
  }
};

}  // namespace loom
