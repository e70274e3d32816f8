// tests/train/metrics_test.cpp — MetricsWriter: CRC-32C check value, TFRecord framing, the JSONL
// lines, and the event file read back by TensorBoard's own reader (tools/read_tb_events.py;
// skipped when the python3 tensorboard package is missing).
#include "train/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <tuple>

#include "core/crc32c.h"
#include "core/error.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("loom_metrics_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  return dir;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Metrics, MaskedCrc32c) {
  EXPECT_EQ(crc32c("", 0), 0u);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(tfevents::masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(Metrics, TfRecordFraming) {
  const std::string data = "hello";
  const std::string rec = tfevents::tf_record(data);
  ASSERT_EQ(rec.size(), 8u + 4 + data.size() + 4);
  EXPECT_EQ(static_cast<unsigned char>(rec[0]), 5u);
  for (int i = 1; i < 8; ++i) EXPECT_EQ(rec[i], 0);
  EXPECT_EQ(rec.substr(12, 5), data);
  auto le32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(rec[at + i]);
    return v;
  };
  EXPECT_EQ(le32(8), tfevents::masked_crc32c(rec.substr(0, 8)));
  EXPECT_EQ(le32(17), tfevents::masked_crc32c(data));
}

TEST(Metrics, JsonLines) {
  const fs::path dir = fresh_dir("jsonl");
  {
    MetricsWriter w(dir.string(), true, false);
    EXPECT_EQ(w.events_path(), "");
    w.write(10, {{"loss", 3.25}, {"lr", 6e-4}});
    w.write(11, {{"loss", 3.0}, {"nan", std::nan("")}});
    EXPECT_THROW(w.write(12, {{"step", 1.0}}), Error);
    EXPECT_THROW(w.write(12, {{"a", 1.0}, {"a", 2.0}}), Error);
  }
  {
    MetricsWriter again(dir.string(), true, false);
    again.write(12, {{"loss", 2.5}});
  }  // appends
  const auto lines = read_lines((dir / "metrics.jsonl").string());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], R"({"step":10,"loss":3.25,"lr":0.0006})");
  const auto j = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(j["step"].get<int64_t>(), 11);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 3.0);
  EXPECT_TRUE(j["nan"].is_null());
  EXPECT_EQ(nlohmann::json::parse(lines[2])["step"].get<int64_t>(), 12);
  fs::remove_all(dir);
}

std::string run_command(const std::string& cmd, int* status) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *status = -1;
    return "";
  }
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  *status = pclose(p);
  return out;
}

TEST(Metrics, TensorBoardReadsTheEventFile) {
  const fs::path dir = fresh_dir("tb");
  std::string events;
  {
    MetricsWriter w(dir.string(), false, true);
    events = w.events_path();
    EXPECT_NE(events.find("events.out.tfevents."), std::string::npos);
    w.write(0, {{"loss", 10.5}, {"lr", 1e-4}});
    w.write(1, {{"loss", 9.75}});
    w.write(300000000000LL, {{"loss", 1.0 / 3.0}});
  }
  if (std::system("python3 -c \"import tensorboard\" > /dev/null 2>&1") != 0) {
    fs::remove_all(dir);
    GTEST_SKIP() << "python3 tensorboard package not installed (pip install tensorboard)";
  }
#ifdef LOOM_SOURCE_DIR
  const fs::path root = LOOM_SOURCE_DIR;
#else  // tests/train/metrics_test.cpp → repository root
  const fs::path root = fs::path(__FILE__).parent_path().parent_path().parent_path();
#endif
  const fs::path script = root / "tools" / "read_tb_events.py";
  ASSERT_TRUE(fs::exists(script)) << script;
  int status = 0;
  const std::string out =
      run_command("python3 '" + script.string() + "' '" + events + "' 2>&1", &status);
  ASSERT_EQ(status, 0) << out;
  std::ostringstream want;
  want.precision(9);
  const std::vector<std::tuple<std::string, int64_t, double>> written = {
      {"loss", 0, 10.5}, {"lr", 0, 1e-4}, {"loss", 1, 9.75}, {"loss", 300000000000LL, 1.0 / 3.0}};
  for (const auto& [tag, step, v] : written) {
    want << tag << "," << step << "," << static_cast<double>(static_cast<float>(v)) << "\n";
  }
  EXPECT_EQ(out, want.str());
  fs::remove_all(dir);
}

// A resumed run reads as one run: resumed_at(2) keeps the first run's metrics.jsonl lines up
// to step 2 and records a restart at step 3 in the new event file, so TensorBoard (its own
// reader, merging the directory's event files) shows steps 0-5 once each, 3-5 from the resumed
// run; metrics.jsonl likewise, a torn last line of the killed run dropped.
TEST(Metrics, ResumedRunReadsAsOneRun) {
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("loom_metrics_resume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    MetricsWriter first(dir.string(), true, true);
    for (int s = 0; s < 6; ++s) first.write(s, {{"loss", 10.0 - s}});
  }
  std::ofstream(dir / "metrics.jsonl", std::ios::app) << "{\"step\": 6, \"lo";  // torn
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // a later event file name
  {
    MetricsWriter second(dir.string(), true, true);
    second.resumed_at(2);
    for (int s = 3; s < 6; ++s) second.write(s, {{"loss", 100.0 + s}});
  }
  std::ifstream jl(dir / "metrics.jsonl");
  std::string line, steps;
  while (std::getline(jl, line)) steps += line.substr(0, line.find(',')) + ";";
  EXPECT_EQ(steps, "{\"step\":0;{\"step\":1;{\"step\":2;{\"step\":3;{\"step\":4;{\"step\":5;");
  if (std::system("python3 -c \"import tensorboard\" > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 tensorboard package not installed (pip install tensorboard)";
  }
#ifdef LOOM_SOURCE_DIR
  const fs::path root = LOOM_SOURCE_DIR;
#else
  const fs::path root = fs::path(__FILE__).parent_path().parent_path().parent_path();
#endif
  int status = 0;
  const std::string out =
      run_command("python3 '" + (root / "tools" / "read_tb_events.py").string() + "' --run '" +
                      dir.string() + "' 2>/dev/null",
                  &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(out, "loss,0,10\nloss,1,9\nloss,2,8\nloss,3,103\nloss,4,104\nloss,5,105\n");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
