// train/checkpoint.h — native checkpoints: a directory `step_00000123/` holding `meta.yaml`
// (format version, step, the run's state as key/value pairs, the effective config) and
// `tensors_<rank>.safetensors` (one per writing rank). Every stored tensor is one piece of a
// global, layout-free tensor (Note [Pieces] in core/tensor_piece.h): its name is the global
// tensor's
// ("model.wte.weight", "optim.exp_avg.wte.weight"), its metadata says which piece it is and
// holds a CRC-32C per 1 MiB block. A run of any layout reads each of its own pieces from the
// stored pieces that overlap it, and only the byte ranges it needs (CheckpointReader): the
// format is described for other readers in docs/checkpoints.md.
//
// Note [Atomic checkpoints]: a checkpoint is written into a hidden temporary directory, every
// file and the directory are fsync'ed, and only then is it renamed to its final name (and the
// parent fsync'ed). Older checkpoints are pruned only after that, and the newest is never
// pruned, so a crash or a full disk at any moment leaves the last good checkpoint intact.
// Reading checks the format version, every size, and the checksum of every block it reads, and
// names the file and tensor on any damage.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/tensor_piece.h"

namespace loom {
namespace parallel {
class Communicator;
}

constexpr int kCheckpointFormatVersion = 2;
constexpr int64_t kCheckpointCrcBlockBytes = int64_t{1} << 20;

// One piece of a global tensor, as a rank writes it.
struct CheckpointTensor {
  std::string name;   // the global tensor's name, e.g. "model.wte.weight"
  Tensor values;      // the piece's values (any device, any layout; numel = piece.numel())
  TensorPiece piece;  // which elements of the global tensor they are
};
// A whole tensor (a piece covering all of it).
CheckpointTensor whole_tensor(const std::string& name, const Tensor& t);

struct CheckpointContents {
  int64_t step = 0;
  std::map<std::string, std::string> state;  // e.g. "loader.position" → "1234"
  std::string config_yaml;                   // the effective config of the run
  std::vector<CheckpointTensor> tensors;
};

// Writes <root>/step_<step>/ atomically and keeps the newest `keep` checkpoints (0 = all).
// Returns the checkpoint's directory. With a communicator, every member calls it with its own
// pieces (names unique within a member), each writes tensors_<rank>.safetensors, and member 0
// writes meta.yaml and publishes the directory only once every member's file is on disk; a
// failure on any member fails the save everywhere and leaves the previous checkpoints as they
// were.
std::string save_checkpoint(const std::string& root, const CheckpointContents& c, int64_t keep,
                            parallel::Communicator* comm = nullptr);

// Note [Asynchronous checkpoints]: a save in two halves, so that the files are written while
// training goes on. The constructor (collective) prepares the temporary directory and
// snapshots this rank's tensors into host memory — after it returns, training may change them —
// then writes the files: on a background thread when `async`, which does no communication (the
// communicators' order stays the main thread's). finish() (collective) waits for this rank's
// files, agrees with every rank and publishes the checkpoint (Note [Atomic checkpoints]); until
// then `latest` is the previous one. The files are the same bytes as a synchronous save's.
// Destroyed unfinished, it waits for its thread and publishes nothing.
class CheckpointWriter {
 public:
  CheckpointWriter(const std::string& root, CheckpointContents c, int64_t keep,
                   parallel::Communicator* comm, bool async);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  // Returns the checkpoint's directory; throws (on every rank) when any rank failed.
  std::string finish();

 private:
  std::string root_;
  int64_t keep_;
  parallel::Communicator* comm_;
  int64_t step_;
  std::string error_;  // this rank's failure, written by the writing thread before it ends
  std::thread thread_;
};

// A checkpoint opened for reading: meta.yaml and the headers of every tensor file (no tensor
// data is read until asked for).
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);

  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  const std::map<std::string, std::string>& state() const { return state_; }
  const std::string& config_yaml() const { return config_yaml_; }
  // The stored global tensors: name → global shape, in name order.
  std::map<std::string, Shape> tensors() const;
  DType dtype(const std::string& name) const;  // as stored

  // Fills `dst` — the piece `piece` of global tensor `name`, contiguous, on any device — from
  // every stored piece that overlaps it, reading only the byte ranges it needs, each checked
  // against its blocks' checksums. Throws naming the tensor when the global shape or the dtype
  // differs, when some element is stored nowhere (or twice), or when a value is not finite.
  void read(const std::string& name, const TensorPiece& piece, const Tensor& dst) const;
  // The whole global tensor, on the host in its stored dtype.
  Tensor read_whole(const std::string& name) const;

 private:
  struct Stored {
    size_t file = 0;  // index into files_
    uint64_t begin = 0, end = 0;
    DType dtype = DType::kF32;
    TensorPiece piece;
    std::vector<uint32_t> crcs;  // one per kCheckpointCrcBlockBytes of the data
  };
  void read_into(const std::string& name, const TensorPiece& piece, const Tensor& host) const;

  std::string dir_;
  int64_t step_ = 0;
  std::map<std::string, std::string> state_;
  std::string config_yaml_;
  std::vector<std::string> files_;
  std::map<std::string, std::vector<Stored>> stored_;
};

// Whether every value of a contiguous host tensor is finite (integer tensors: true). What the
// reader checks every piece with, and init_from every file's tensor.
bool all_finite(const Tensor& host);

// Every global tensor of the checkpoint read whole (tests, small tools), with its meta.yaml.
CheckpointContents load_checkpoint(const std::string& dir);
// The newest complete checkpoint under root, or "" when there is none.
std::string latest_checkpoint(const std::string& root);
// The checkpoint `dir` names: itself when it is one (or is no directory), else — a run's
// checkpoints folder (<out_dir>/checkpoints) — its newest complete checkpoint, "" when it holds
// none. What train.init_from, train --resume DIR and convert --from loom:DIR take.
std::string checkpoint_in(const std::string& dir);
// Every complete checkpoint under root, newest first; `incomplete` (when given) receives the
// step_N folders without meta.yaml (damaged by hand or by a file system: a save never leaves
// one, Note [Atomic checkpoints]).
std::vector<std::string> checkpoints_newest_first(const std::string& root,
                                                  std::vector<std::string>* incomplete = nullptr);
std::string checkpoint_dir_name(int64_t step);

}  // namespace loom
