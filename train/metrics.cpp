// train/metrics.cpp — MetricsWriter, TFRecord framing (CRC-32C from train/crc32c.h) and the
// hand-encoded protobuf of TensorBoard scalar events (field numbers from tensorflow's
// event.proto and summary.proto).
#include "train/metrics.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/crc32c.h"
#include "core/error.h"

namespace loom {
namespace tfevents {
namespace {

void put_fixed(std::string& out, uint64_t v, int bytes) {  // little-endian
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Protobuf wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
void put_tag(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

void put_bytes_field(std::string& out, uint32_t field, std::string_view bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

void put_double_field(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_tag(out, field, 1);
  put_fixed(out, bits, 8);
}

void put_float_field(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_tag(out, field, 5);
  put_fixed(out, bits, 4);
}

// Event fields 1 (wall_time) and 2 (step); int64 is a varint of its two's complement.
std::string event_header(double wall_time, int64_t step) {
  std::string ev;
  put_double_field(ev, 1, wall_time);
  put_tag(ev, 2, 0);
  put_varint(ev, static_cast<uint64_t>(step));
  return ev;
}

}  // namespace

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = loom::crc32c(data.data(), data.size());
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tf_record(std::string_view data) {
  std::string len;
  put_fixed(len, data.size(), 8);
  std::string rec = len;
  put_fixed(rec, masked_crc32c(len), 4);
  rec.append(data);
  put_fixed(rec, masked_crc32c(data), 4);
  return rec;
}

std::string encode_file_version_event(double wall_time, const std::string& version) {
  std::string ev = event_header(wall_time, 0);
  put_bytes_field(ev, 3, version);
  return ev;
}

std::string encode_scalars_event(double wall_time, int64_t step,
                                 const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;  // Summary.Value
    put_bytes_field(v, 1, tag);
    put_float_field(v, 2, static_cast<float>(value));
    put_bytes_field(summary, 1, v);
  }
  std::string ev = event_header(wall_time, step);
  put_bytes_field(ev, 5, summary);
  return ev;
}

std::string encode_session_start_event(double wall_time, int64_t step) {
  std::string log;  // SessionLog{status = 1: START}
  put_tag(log, 1, 0);
  put_varint(log, 1);
  std::string ev = event_header(wall_time, step);
  put_bytes_field(ev, 7, log);
  return ev;
}

}  // namespace tfevents

namespace {

double unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf.data();
}

// <dir>/events.out.tfevents.<secs>.<host>, with ".N" appended if that file already exists.
std::string new_events_path(const std::filesystem::path& dir) {
  const auto secs = static_cast<int64_t>(unix_seconds());
  const std::string base =
      (dir / ("events.out.tfevents." + std::to_string(secs) + "." + host_name())).string();
  std::string path = base;
  for (int n = 1; std::filesystem::exists(path); ++n) path = base + "." + std::to_string(n);
  return path;
}

void check_names(const std::vector<std::pair<std::string, double>>& scalars) {
  std::set<std::string> seen{"step"};
  for (const auto& kv : scalars) {
    LOOM_CHECK(seen.insert(kv.first).second, "metrics: metric name '", kv.first,
               "' is reserved or repeated");
  }
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& dir, bool jsonl, bool tensorboard) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  LOOM_CHECK(!ec, "metrics: cannot create directory '", dir, "': ", ec.message());
  if (jsonl) {
    jsonl_path_ = (std::filesystem::path(dir) / "metrics.jsonl").string();
    jsonl_.open(jsonl_path_, std::ios::app);
    LOOM_CHECK(jsonl_.good(), "metrics: cannot open '", jsonl_path_, "': ", std::strerror(errno));
  }
  if (tensorboard) {
    events_path_ = new_events_path(dir);
    events_.open(events_path_, std::ios::binary | std::ios::trunc);
    LOOM_CHECK(events_.good(), "metrics: cannot open '", events_path_, "': ", std::strerror(errno));
    events_ << tfevents::tf_record(
        tfevents::encode_file_version_event(unix_seconds(), "brain.Event:2"));
    events_.flush();
  }
}

void MetricsWriter::resumed_at(int64_t step) {
  if (jsonl_.is_open()) {
    jsonl_.close();
    std::ifstream in(jsonl_path_);
    std::string kept, line;
    while (std::getline(in, line)) {
      int64_t s = -1;
      try {
        s = nlohmann::json::parse(line).value("step", int64_t{-1});
      } catch (const nlohmann::json::exception&) {
        s = -1;  // a torn last line of a killed run: dropped
      }
      if (s >= 0 && s <= step) kept += line + "\n";
    }
    in.close();
    const std::string tmp = jsonl_path_ + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << kept;
      LOOM_CHECK(out.flush(), "metrics: cannot write '", tmp, "'");
    }
    std::filesystem::rename(tmp, jsonl_path_);
    jsonl_.open(jsonl_path_, std::ios::app);
    LOOM_CHECK(jsonl_.good(), "metrics: cannot open '", jsonl_path_, "': ", std::strerror(errno));
  }
  if (events_.is_open()) {
    events_ << tfevents::tf_record(tfevents::encode_session_start_event(unix_seconds(), step + 1));
    events_.flush();
    LOOM_CHECK(events_.good(), "metrics: write to '", events_path_, "' failed");
  }
}

void MetricsWriter::write(int64_t step,
                          const std::vector<std::pair<std::string, double>>& scalars) {
  check_names(scalars);
  if (jsonl_.is_open()) {
    nlohmann::ordered_json j;
    j["step"] = step;
    for (const auto& [name, value] : scalars) j[name] = value;
    jsonl_ << j.dump() << '\n';
    jsonl_.flush();
    LOOM_CHECK(jsonl_.good(), "metrics: write to '", jsonl_path_, "' failed");
  }
  if (events_.is_open()) {
    events_ << tfevents::tf_record(tfevents::encode_scalars_event(unix_seconds(), step, scalars));
    events_.flush();
    LOOM_CHECK(events_.good(), "metrics: write to '", events_path_, "' failed");
  }
}

}  // namespace loom
