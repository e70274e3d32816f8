// data/packed_loader.h — PackedLoader: the variable-length (post-training) counterpart of
// DataLoader. It reads document shards (data/documents.h: tokens, document offsets, a per-token
// loss mask), takes each step's global minibatch of whole documents, splits it over the
// data-parallel ranks (balanced by cost, data/balance.h, or in order) and packs each rank's share
// into micro-batches under a token budget: several documents per row, positions restarting at 0
// for each, and the document starts the block-diagonal attention needs (Note [Attention kernel
// contract] in kernels/attention.h). Deterministic and resumable like DataLoader: every rank
// computes the whole step's plan from (seed, epoch, position) without communicating, so every
// rank also knows the global number of loss tokens the step's loss is normalised by.
//
// Note [Packed steps]: documents are the units. Epoch e visits the documents in a permutation
// fixed by (seed, e) (loader_permutation); step s of an epoch takes permutation entries
// [s·G, (s+1)·G), G = docs_per_rank · world_size. A document longer than max_len + 1 tokens is
// cut to its first max_len + 1 (max_len input tokens: data.seq_len); documents of fewer than 2
// tokens (no input/target pair) are left out when the shards are opened. A document of n tokens
// gives n − 1 input tokens (its first n − 1) and n − 1 targets (its last n − 1); a target counts in
// the loss iff its loss-mask byte is 1, else it is -100 (ignored). The step's loss is
//     Σ over every rank's loss tokens of the token's cross-entropy / (the step's loss tokens),
// whatever the split — so a run is comparable to one process on the same minibatch (the step
// runner scales each micro-batch's mean by its share: train/step_runner.h). Splitting:
// `balance` none gives rank r entries [r·B, (r+1)·B) of the step (B = docs_per_rank); tokens or
// flops partitions the G documents by cost (partition_balanced: tokens, or a·s² + b·s from the
// model's FLOPs). Each rank's share is then cut into micro-batches of at most max_tokens input
// tokens, heaviest document first (cut_microbatches), and each micro-batch is one packed row.
// A rank always runs at least one micro-batch; with equal_micro_batches (ZeRO-3 with collectives,
// whose per-unit gathers every rank must join) every rank runs the largest count and a rank with
// fewer pads with empty micro-batches (one ignored token: a forward and backward with no loss).
//
// Note [Loss tokens and the cut]: the cut can remove loss tokens — a long system prompt pushes
// the assistant's reply past max_len. PackedLoader counts, when it opens the shards, the loss
// tokens kept and lost and the documents left with none (stats(); the trainer logs them, as
// PackedSource::summary in data/step_source.h words them), and refuses data with no loss token
// left, naming the key and max_len. A step whose documents hold no loss token has
// global_loss_tokens 0; the trainer skips it with a warning (no update: weight decay and the
// moments would move the weights with nothing learnt), and validation leaves such a step out of
// its mean (train/train_step.cpp, train/sampling.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/balance.h"
#include "data/documents.h"
#include "data/loader.h"
#include "data/step_data.h"

namespace loom {

enum class BalanceMode { kNone, kTokens, kFlops };
BalanceMode parse_balance_mode(const std::string& name);  // "none" | "tokens" | "flops"
const char* balance_mode_name(BalanceMode mode);

struct PackingOptions {
  int64_t docs_per_rank = 8;  // B: the step's documents are B · world_size
  int64_t max_len = 1024;     // longest input of one document (data.seq_len)
  int64_t max_tokens = 8192;  // input tokens of one micro-batch (≥ max_len)
  BalanceMode balance = BalanceMode::kNone;
  SequenceCost cost;  // balance flops: a, b (tokens uses {0, 1})
  bool equal_micro_batches = false;
  int rank = 0, world_size = 1;
  uint64_t seed = 1337;
  int64_t vocab_size = 0;          // > 0: every shard's tokens checked below it when opened
  std::string key = "data.train";  // the config key the shards came from, for errors
};

// What the cut at max_len does to the data (Note [Loss tokens and the cut]); documents of 2
// tokens or more.
struct PackedDataStats {
  int64_t documents = 0;
  int64_t cut_documents = 0;      // longer than max_len + 1 tokens
  int64_t loss_tokens = 0;        // targets with loss-mask 1 within the cut
  int64_t cut_loss_tokens = 0;    // past the cut: never trained on
  int64_t no_loss_documents = 0;  // no loss token within the cut
};

// The step as this rank runs it, with what every rank knows of the others. Each micro-batch is
// one packed row (1, L) of documents side by side, with their positions and starts.
struct PackedStep {
  std::vector<MicroBatch> micro;            // this rank's, in order; at least one
  int64_t global_loss_tokens = 0;           // over every rank's documents of the step
  int64_t global_tokens = 0;                // input tokens of the whole step
  std::vector<int64_t> rank_tokens;         // input tokens of each rank's share
  std::vector<double> rank_cost;            // each rank's planned cost (the balance's measure)
  std::vector<int64_t> rank_micro_batches;  // before padding
};

class PackedLoader {
 public:
  PackedLoader(const std::vector<std::string>& shard_paths, const PackingOptions& options);

  PackedStep next();  // this rank's next step; rolls into the next epoch when one is exhausted

  LoaderState state() const { return {epoch_, position_}; }
  void set_state(LoaderState state);  // validates it against this data
  std::string fingerprint() const;    // Note [Data fingerprint] in data/loader.h

  int64_t num_documents() const { return static_cast<int64_t>(docs_.size()); }
  int64_t steps_per_epoch() const;
  const PackingOptions& options() const { return opt_; }
  const PackedDataStats& stats() const { return stats_; }

 private:
  struct Doc {
    int32_t shard;
    int64_t index;   // in its shard
    int64_t inputs;  // input tokens after the cut (≥ 1)
  };
  MicroBatch pack(const std::vector<int64_t>& step_docs, const std::vector<int64_t>& members) const;
  int64_t loss_tokens(const Doc& d) const;
  void count_cut(std::span<const uint8_t> mask, int64_t kept);

  std::vector<DocumentReader> shards_;
  std::vector<Doc> docs_;
  PackingOptions opt_;
  PackedDataStats stats_;
  int64_t epoch_ = 0, position_ = 0;
  int64_t perm_epoch_ = -1;
  std::vector<int64_t> perm_;
};

// Every rank's documents of one step (indices into `lengths`), by `balance`: what
// PackedLoader::next() applies; exposed for tests and the imbalance benchmark.
std::vector<std::vector<int64_t>> split_step(const std::vector<int64_t>& lengths, int parts,
                                             BalanceMode balance, const SequenceCost& cost);

}  // namespace loom
