// train/metrics.h — per-step metrics sinks: a JSON-lines file (metrics.jsonl) and a TensorBoard
// scalar event file, written directly (TFRecord framing and the Event protobuf encoded by hand;
// no TensorFlow or protobuf dependency). Rank-0 logging is the caller's choice; this writes
// whatever it is given and holds no global state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

namespace tfevents {

// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(std::string_view data);
// One TFRecord: uint64 length (LE), masked CRC of those 8 bytes (uint32 LE), data, masked CRC of
// data (uint32 LE).
std::string tf_record(std::string_view data);
// Serialized Event{wall_time = 1 (double), step = 2 (int64), file_version = 3 (string)}.
std::string encode_file_version_event(double wall_time, const std::string& version);
// Serialized Event{wall_time, step, summary = 5 {value = 1 {tag = 1, simple_value = 2 (float)}}}
// with one value per scalar.
std::string encode_scalars_event(double wall_time, int64_t step,
                                 const std::vector<std::pair<std::string, double>>& scalars);
// Serialized Event{wall_time, step, session_log = 7 {status = 1: START (1)}}: TensorBoard drops
// every event of the run's earlier files at or after `step` when it reads one (a restart).
std::string encode_session_start_event(double wall_time, int64_t step);

}  // namespace tfevents

class MetricsWriter {
 public:
  // Creates `dir` if needed. With jsonl, appends to <dir>/metrics.jsonl (a resumed run continues
  // the file). With tensorboard, creates <dir>/events.out.tfevents.<unix seconds>.<host> (a
  // ".N" suffix is added if that name exists) and writes the "brain.Event:2" version record.
  explicit MetricsWriter(const std::string& dir, bool jsonl = true, bool tensorboard = true);
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // One line {"step": step, "<name>": value, ...} (names in the given order; non-finite values
  // are written as null) and one event holding every scalar under its name as the tag. Both
  // are flushed before returning. A name "step" or a repeated name is an error.
  void write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

  // A resumed run continues from `step`: metrics.jsonl keeps only the lines of steps ≤ step (the
  // steps after it are trained again), and the event file records a restart at step + 1, so
  // TensorBoard shows each step once across the run's event files.
  void resumed_at(int64_t step);

  const std::string& jsonl_path() const { return jsonl_path_; }    // "" when disabled
  const std::string& events_path() const { return events_path_; }  // "" when disabled

 private:
  std::string jsonl_path_, events_path_;
  std::ofstream jsonl_, events_;
};

}  // namespace loom
