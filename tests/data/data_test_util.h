// tests/data/data_test_util.h — helpers shared by the data/ tests: source-tree paths (from
// LOOM_SOURCE_DIR or __FILE__, so tests work from any build directory) and a self-deleting
// temporary directory.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace loom::data_test {

// LOOM_SOURCE_DIR (set by tests/CMakeLists.txt) is absolute; __FILE__ may be relative to the build
// directory (ccache's base_dir rewrites it), which breaks when ctest runs from another folder.
inline std::filesystem::path source_root() {
#ifdef LOOM_SOURCE_DIR
  return std::filesystem::path(LOOM_SOURCE_DIR);
#else
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
#endif
}
inline std::string bpe_dir() { return (source_root() / "data" / "gpt2-bpe").string(); }
inline std::string cases_path() {
  return (source_root() / "tests" / "data" / "testdata" / "gpt2_tokenizer_cases.jsonl").string();
}

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  // Named after the running test (plus `tag`), so one test can hold several.
  explicit TempDir(const std::string& tag = "") {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string test = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
    path_ = std::filesystem::temp_directory_path() /
            ("loom_data_" + std::to_string(::getpid()) + "_" + test + tag);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace loom::data_test
