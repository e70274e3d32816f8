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
                       const void* tokens, size_t count, int width) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  LOOM_INPUT_CHECK(f != nullptr, path, ": cannot write shard: ", std::strerror(errno));
  bool ok = std::fwrite(header.data(), 4, header.size(), f) == header.size();
  ok = ok && (count == 0 || std::fwrite(tokens, static_cast<size_t>(width), count, f) == count);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    LOOM_INPUT_FAIL(path, ": cannot write shard: ", std::strerror(err));
  }
}

std::vector<int32_t> shard_header(int64_t count, int width) {
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = width == 2 ? kShardMagic : kShardMagic32;
  header[1] = width == 2 ? kShardVersion : kShardVersion32;
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
  write_shard_bytes(path, shard_header(static_cast<int64_t>(tokens.size()), 2), tokens.data(),
                    tokens.size(), 2);
}

void write_shard(const std::string& path, std::span<const int32_t> tokens, int width) {
  check_count(path, tokens.size());
  LOOM_CHECK(width == 2 || width == 4, path, ": a shard's tokens are 2 or 4 bytes, not ", width);
  if (width == 4) {
    for (size_t i = 0; i < tokens.size(); ++i)
      LOOM_CHECK(tokens[i] >= 0, path, ": token ", tokens[i], " at index ", i, " is negative");
    write_shard_bytes(path, shard_header(static_cast<int64_t>(tokens.size()), 4), tokens.data(),
                      tokens.size(), 4);
    return;
  }
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
    LOOM_INPUT_CHECK(header[0] == kShardMagic || header[0] == kShardMagic32, path, ": bad magic ",
                     header[0], " (expected ", kShardMagic, " or ", kShardMagic32,
                     "): not an llm.c token shard");
    const bool wide = header[0] == kShardMagic32;
    const int32_t version = wide ? kShardVersion32 : kShardVersion;
    LOOM_INPUT_CHECK(header[1] == version, path, ": unsupported shard version ", header[1],
                     " (expected ", version, " with magic ", header[0], ", uint", wide ? 32 : 16,
                     " tokens)");
    width_ = wide ? 4 : 2;
    LOOM_INPUT_CHECK(header[2] >= 0, path, ": negative token count ", header[2], " in header");
    const int64_t count = header[2], want = kShardHeaderBytes + width_ * count;
    LOOM_INPUT_CHECK(file_bytes >= want, path, ": truncated: header says ", count, " tokens (",
                     width_ * count, " bytes + ", kShardHeaderBytes, " header = ", want,
                     " bytes) but file has ", file_bytes, " bytes");
    LOOM_INPUT_CHECK(file_bytes == want, path, ": ", file_bytes - want,
                     " trailing bytes: header says ", count, " tokens (", want,
                     " bytes with the header) but file has ", file_bytes, " bytes");
    num_tokens_ = count;
  } catch (...) {
    unmap();
    throw;
  }
  tokens_ = static_cast<const char*>(map_) + kShardHeaderBytes;
}

void ShardReader::unmap() {
  if (map_ != nullptr && map_ != MAP_FAILED) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  num_tokens_ = 0;
  width_ = 2;
}

ShardReader::~ShardReader() { unmap(); }

ShardReader::ShardReader(ShardReader&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      num_tokens_(std::exchange(other.num_tokens_, 0)),
      width_(other.width_) {}

ShardReader& ShardReader::operator=(ShardReader&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    num_tokens_ = std::exchange(other.num_tokens_, 0);
    width_ = other.width_;
  }
  return *this;
}

void TokenSpan::copy_to(int32_t* dst) const {
  if (width_ == 2) {
    const auto* t = reinterpret_cast<const uint16_t*>(data_);
    for (int64_t k = 0; k < size_; ++k) dst[k] = t[k];
  } else {
    std::memcpy(dst, data_, bytes());
  }
}

namespace {
template <typename T>
int64_t first_at_or_above(const T* t, int64_t n, int64_t limit) {
  int64_t largest = -1;
#pragma omp parallel for reduction(max : largest) schedule(static)
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, static_cast<int64_t>(t[i]));
  if (largest < limit) return -1;
  int64_t at = 0;
  while (static_cast<int64_t>(t[at]) < limit) ++at;
  return at;
}
}  // namespace

int64_t first_token_at_or_above(TokenSpan tokens, int64_t limit) {
  if (tokens.width() == 2)
    return first_at_or_above(static_cast<const uint16_t*>(tokens.data()), tokens.size(), limit);
  return first_at_or_above(static_cast<const uint32_t*>(tokens.data()), tokens.size(), limit);
}

}  // namespace loom
