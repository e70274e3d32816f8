// data/loader.h — DataLoader: a deterministic, resumable, distributed stream of (B, T) input and
// target batches over memory-mapped token shards. It reads shards only; it never writes them,
// holds no global state, and does no communication (every rank computes the same permutation).
//
// Note [Loader windows]: the shards, in the order given, form one token stream of N tokens.
// Window w is the T+1 tokens starting at w·T (so consecutive windows share one token: the last
// target of one window is the first input of the next); windows may span shard boundaries, so
// nothing is lost at shard ends. There are (N-1)/T windows. Epoch e visits them in a permutation
// fixed by (seed, e) (Fisher–Yates driven by Philox-4x32-10). Global step s of an epoch takes
// permutation entries [s·G, (s+1)·G) with G = B·world_size, and rank r takes the r-th block of B
// of those: rank streams are disjoint, and their union is the world-size-1 batch of size G.
// An epoch has floor(windows / G) steps; the remaining windows are skipped for that epoch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/shard.h"

namespace loom {

struct Batch {
  Tensor inputs;   // i32 (B, T), CPU
  Tensor targets;  // i32 (B, T), CPU: inputs shifted left by one token
};

// Where the loader is: `position` permutation entries of epoch `epoch` have been consumed by
// the global batches so far. Saved in checkpoints; identical on every rank.
struct LoaderState {
  int64_t epoch = 0;
  int64_t position = 0;
  bool operator==(const LoaderState&) const = default;
};

// Note [Data fingerprint]: a loader's position means something only for the shards it was
// saved with. Checkpoints store the loaders' fingerprint — each shard's file name and size
// ("train_000000.bin: 679854 tokens", for document shards also their documents and the
// checksum of the tokens that their .docs records) — and a resume compares it with the data it
// opened: re-prepared or other data under the same glob is named (which shard, what changed)
// and stops the run, rather than passing for a damaged checkpoint or silently continuing from
// a position in other data. The names are the files' base names, so data moved to another
// folder still resumes.
// data_change(saved, now): "" when the fingerprints agree, else what changed, naming a shard.
std::string data_change(const std::string& saved, const std::string& now);
// One shard's entry of a fingerprint ("<base name>: <what>"); fingerprints join entries by "; ".
std::string fingerprint_entry(const std::string& path, const std::string& what);

class DataLoader {
 public:
  // vocab_size > 0: every token of every shard is checked below it here, when the shards are
  // opened (not when a batch happens to draw a bad one), the error naming the shard and offset.
  DataLoader(const std::vector<std::string>& shard_paths, int64_t B, int64_t T, int rank,
             int world_size, uint64_t seed, int64_t vocab_size = 0);

  Batch next();  // this rank's next batch; rolls into the next epoch when one is exhausted

  LoaderState state() const { return {epoch_, position_}; }
  void set_state(LoaderState state);  // validates it against this data
  std::string fingerprint() const;    // Note [Data fingerprint]

  int64_t num_tokens() const { return num_tokens_; }    // N, all shards
  int64_t num_windows() const { return num_windows_; }  // (N-1)/T
  int64_t steps_per_epoch() const { return num_windows_ / (B_ * world_size_); }
  int64_t batch_size() const { return B_; }
  int64_t seq_len() const { return T_; }
  int world_size() const { return world_size_; }

 private:
  void ensure_permutation();
  void copy_window(int64_t window, int32_t* dst) const;  // T+1 tokens

  std::vector<ShardReader> shards_;
  std::vector<int64_t> shard_start_;  // stream offset of each shard's first token
  int64_t B_, T_;
  int rank_, world_size_;
  uint64_t seed_;
  int64_t num_tokens_ = 0, num_windows_ = 0;
  int64_t epoch_ = 0, position_ = 0;
  int64_t perm_epoch_ = -1;    // the epoch perm_ was built for
  std::vector<int64_t> perm_;  // window order of perm_epoch_
};

// The window order of one epoch: a permutation of [0, num_windows) fixed by (seed, epoch).
std::vector<int64_t> loader_permutation(int64_t num_windows, uint64_t seed, int64_t epoch);

}  // namespace loom
