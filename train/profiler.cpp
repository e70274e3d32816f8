// train/profiler.cpp — Chrome trace events ("ph": "X") with a track (tid) per name.
#include "train/profiler.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom {

TraceRecorder::TraceRecorder(int rank) : rank_(rank), origin_(Clock::now()) {}

double TraceRecorder::us(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

void TraceRecorder::span(const std::string& track, const std::string& name, Clock::time_point begin,
                         Clock::time_point end, const std::string& args_json) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({track, name, args_json, us(begin), us(end) - us(begin)});
}

void TraceRecorder::comm(const parallel::CommEvent& e) {
  span("comm:" + e.group, e.op, e.started, e.finished,
       "{\"bytes\": " + std::to_string(e.bytes) +
           ", \"queued_us\": " + std::to_string(us(e.queued)) + "}");
}

size_t TraceRecorder::num_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

void TraceRecorder::write(const std::string& path) const {
  using nlohmann::json;
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int> tids{{"compute", 0}};
  json events = json::array();
  for (const Event& e : events_) {
    auto it = tids.emplace(e.track, static_cast<int>(tids.size())).first;
    json ev = {{"name", e.name},    {"ph", "X"},     {"pid", rank_},
               {"tid", it->second}, {"ts", e.ts_us}, {"dur", e.dur_us}};
    if (!e.args.empty()) ev["args"] = json::parse(e.args);
    events.push_back(ev);
  }
  for (const auto& [track, tid] : tids) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", rank_},
                      {"tid", tid},
                      {"args", {{"name", track}}}});
  }
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    LOOM_CHECK(out, tmp, ": cannot open for writing");
    out << json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
    LOOM_CHECK(out, tmp, ": write failed");
  }
  LOOM_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, path, ": cannot rename into place");
}

}  // namespace loom
