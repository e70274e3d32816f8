// train/run_lock.h — RunLock: one run at a time per output directory. Two runs writing the same
// train.out_dir would overwrite each other's checkpoints and metrics (and one would die pruning
// the other's files); the second is refused instead, naming the first one's process.
#pragma once

#include <string>

namespace loom {

class RunLock {
 public:
  // Locks <dir>/.lock (flock: released when the process ends, kill -9 included) and writes this
  // process's pid and host into it. Throws ConfigError naming train.out_dir and the other run's
  // pid and host when another process (or another open run in this one) holds it.
  explicit RunLock(const std::string& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace loom
