// data/shard.cpp — writing and memory-mapping llm.c token shards (format in data/shard.h).
// Every error names the shard file and what is wrong with it.
#include "data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.h"

namespace loom {
namespace {

void write_shard_bytes(const std::string& path, const std::vector<int32_t>& header,
                       const uint16_t* tokens, size_t count) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  LOOM_INPUT_CHECK(f != nullptr, path, ": cannot write shard: ", std::strerror(errno));
  bool ok = std::fwrite(header.data(), 4, header.size(), f) == header.size();
  ok = ok && (count == 0 || std::fwrite(tokens, 2, count, f) == count);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    LOOM_INPUT_FAIL(path, ": cannot write shard: ", std::strerror(err));
  }
}

std::vector<int32_t> shard_header(int64_t count) {
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(count);
  return header;
}

void check_count(const std::string& path, size_t count) {
  LOOM_CHECK(count <= static_cast<size_t>(INT32_MAX), path, ": ", count,
             " tokens do not fit one shard (the header counts in int32)");
}

}  // namespace

void write_shard(const std::string& path, std::span<const uint16_t> tokens) {
  check_count(path, tokens.size());
  write_shard_bytes(path, shard_header(static_cast<int64_t>(tokens.size())), tokens.data(),
                    tokens.size());
}

void write_shard(const std::string& path, std::span<const int32_t> tokens) {
  check_count(path, tokens.size());
  std::vector<uint16_t> narrow(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    LOOM_CHECK(tokens[i] >= 0 && tokens[i] <= 0xFFFF, path, ": token ", tokens[i], " at index ", i,
               " does not fit the shard's uint16 tokens");
    narrow[i] = static_cast<uint16_t>(tokens[i]);
  }
  write_shard(path, std::span<const uint16_t>(narrow));
}

ShardReader::ShardReader(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LOOM_INPUT_CHECK(fd >= 0, path, ": cannot open shard: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    LOOM_INPUT_FAIL(path, ": cannot stat shard: ", std::strerror(err));
  }
  const auto file_bytes = static_cast<int64_t>(st.st_size);
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    LOOM_INPUT_FAIL(path, ": too small for a shard header: file has ", file_bytes,
                    " bytes, the header ", "alone is ", kShardHeaderBytes);
  }
  map_ = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  LOOM_INPUT_CHECK(map_ != MAP_FAILED, path, ": cannot mmap shard: ", std::strerror(err));
  map_bytes_ = static_cast<size_t>(file_bytes);
  int32_t header[3];
  std::memcpy(header, map_, sizeof(header));
  try {
    LOOM_INPUT_CHECK(header[0] == kShardMagic, path, ": bad magic ", header[0], " (expected ",
                     kShardMagic, "): not an llm.c token shard");
    LOOM_INPUT_CHECK(header[1] == kShardVersion, path, ": unsupported shard version ", header[1],
                     " (expected ", kShardVersion, ", uint16 tokens)");
    LOOM_INPUT_CHECK(header[2] >= 0, path, ": negative token count ", header[2], " in header");
    const int64_t count = header[2], want = kShardHeaderBytes + 2 * count;
    LOOM_INPUT_CHECK(file_bytes >= want, path, ": truncated: header says ", count, " tokens (",
                     2 * count, " bytes + ", kShardHeaderBytes, " header = ", want,
                     " bytes) but file has ", file_bytes, " bytes");
    LOOM_INPUT_CHECK(file_bytes == want, path, ": ", file_bytes - want,
                     " trailing bytes: header says ", count, " tokens (", want,
                     " bytes with the header) but file has ", file_bytes, " bytes");
    num_tokens_ = count;
  } catch (...) {
    unmap();
    throw;
  }
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map_) + kShardHeaderBytes);
}

void ShardReader::unmap() {
  if (map_ != nullptr && map_ != MAP_FAILED) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  num_tokens_ = 0;
}

ShardReader::~ShardReader() { unmap(); }

ShardReader::ShardReader(ShardReader&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      num_tokens_(std::exchange(other.num_tokens_, 0)) {}

ShardReader& ShardReader::operator=(ShardReader&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    num_tokens_ = std::exchange(other.num_tokens_, 0);
  }
  return *this;
}

int64_t first_token_at_or_above(std::span<const uint16_t> tokens, int64_t limit) {
  const uint16_t* t = tokens.data();
  const auto n = static_cast<int64_t>(tokens.size());
  int largest = -1;
#pragma omp parallel for reduction(max : largest) schedule(static)
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, static_cast<int>(t[i]));
  if (largest < limit) return -1;
  int64_t at = 0;
  while (t[at] < limit) ++at;
  return at;
}

}  // namespace loom
