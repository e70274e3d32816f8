// train/checkpoint.h — native checkpoints: a directory `step_00000123/` holding `meta.yaml`
// (format version, step, the run's state as key/value pairs, the effective config) and
// `tensors_<rank>.safetensors` (one per writing rank; named tensors, each with its global shape,
// shard offsets and a CRC-32C in the file's metadata, so a later parallel layout can read any shard
// it needs).
//
// Note [Atomic checkpoints]: a checkpoint is written into a hidden temporary directory, every
// file and the directory are fsync'ed, and only then is it renamed to its final name (and the
// parent fsync'ed). Older checkpoints are pruned only after that, and the newest is never
// pruned, so a crash or a full disk at any moment leaves the last good checkpoint intact.
// Loading checks the format version, every tensor's size and checksum, and names the file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom {
namespace parallel {
class Communicator;
}

constexpr int kCheckpointFormatVersion = 1;

struct CheckpointContents {
  int64_t step = 0;
  std::map<std::string, std::string> state;  // e.g. "loader.position" → "1234"
  std::string config_yaml;                   // the effective config of the run
  std::vector<std::pair<std::string, Tensor>>
      tensors;  // e.g. "model.wte.weight", "optim.exp_avg.…"
};

// Writes <root>/step_<step>/ atomically and keeps the newest `keep` checkpoints (0 = all).
// Returns the checkpoint's directory. With a communicator, every member calls it with its own
// tensors (names unique across members, e.g. ZeRO shards named by their global offsets), each
// writes tensors_<rank>.safetensors, and member 0 writes meta.yaml and publishes the directory
// only once every member's file is on disk; a failure on any member fails the save everywhere
// and leaves the previous checkpoints as they were.
std::string save_checkpoint(const std::string& root, const CheckpointContents& c, int64_t keep,
                            parallel::Communicator* comm = nullptr);
// Reads meta.yaml and every tensor file of the checkpoint (all ranks' shards).
CheckpointContents load_checkpoint(const std::string& dir);
// The newest complete checkpoint under root, or "" when there is none.
std::string latest_checkpoint(const std::string& root);
std::string checkpoint_dir_name(int64_t step);

}  // namespace loom
