// train/profiler.h — a Chrome/Perfetto trace of one rank (`train --profile`): a "compute" track
// with the trainer's phases (forward, backward, gradient sync wait, optimizer) and one track per
// communicator with its operations from start to finish, so bucket reductions can be seen
// running inside backward. Open the JSON in https://ui.perfetto.dev or chrome://tracing.
// Thread-safe: communicator threads report into it while the compute thread does.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"

namespace loom {

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  explicit TraceRecorder(int rank);

  // A complete event [begin, end) on the named track.
  void span(const std::string& track, const std::string& name, Clock::time_point begin,
            Clock::time_point end, const std::string& args_json = "");
  // A communicator operation (its own track "comm:<group>"), from CommObserver.
  void comm(const parallel::CommEvent& e);
  // Writes the Chrome trace JSON (atomically: temp file, rename).
  void write(const std::string& path) const;
  size_t num_events() const;

 private:
  struct Event {
    std::string track, name, args;
    double ts_us, dur_us;
  };
  double us(Clock::time_point t) const;
  int rank_;
  Clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

}  // namespace loom
