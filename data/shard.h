// data/shard.h — the token shard format of llm.c / nanoGPT: a header of 256 little-endian int32
// (magic, version, token count, the rest zero) followed by the tokens: magic 20240520, version 1,
// uint16 tokens (GPT-2's vocabulary), or, as llm.c writes Llama 3's, magic 20240801, version 7,
// uint32 tokens (vocabularies over 65,536). write_shard writes one atomically; ShardReader
// memory-maps one read-only and validates it, naming the file and the problem in every error.
// Nothing here tokenizes or shuffles.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace loom {

inline constexpr int32_t kShardMagic = 20240520;  // uint16 tokens
inline constexpr int32_t kShardVersion = 1;
inline constexpr int32_t kShardMagic32 = 20240801;  // uint32 tokens
inline constexpr int32_t kShardVersion32 = 7;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// The token width (bytes) shards of a vocabulary need: 2 up to 65,536 ids, else 4.
inline int shard_width(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// A read-only run of tokens as a shard holds them (uint16 or uint32), read as int32.
class TokenSpan {
 public:
  TokenSpan() = default;
  TokenSpan(const void* data, int64_t size, int width)
      : data_(static_cast<const char*>(data)), size_(size), width_(width) {}
  int64_t size() const { return size_; }
  int width() const { return width_; }
  const void* data() const { return data_; }
  size_t bytes() const { return static_cast<size_t>(size_) * static_cast<size_t>(width_); }
  int32_t operator[](int64_t i) const {
    return width_ == 2 ? reinterpret_cast<const uint16_t*>(data_)[i]
                       : static_cast<int32_t>(reinterpret_cast<const uint32_t*>(data_)[i]);
  }
  TokenSpan subspan(int64_t offset, int64_t count) const {
    return {data_ + offset * width_, count, width_};
  }
  void copy_to(int32_t* dst) const;  // size() values
  std::vector<int32_t> to_vector() const {
    std::vector<int32_t> v(static_cast<size_t>(size_));
    copy_to(v.data());
    return v;
  }

 private:
  const char* data_ = nullptr;
  int64_t size_ = 0;
  int width_ = 2;
};

// Writes `tokens` to `path` (via path.tmp, then rename) with tokens of `width` bytes (2 or 4).
// Every token must fit (else loom::Error: the caller's bug); a file that cannot be written is a
// loom::InputError naming it.
void write_shard(const std::string& path, std::span<const int32_t> tokens, int width = 2);
void write_shard(const std::string& path, std::span<const uint16_t> tokens);

// The offset of the first token ≥ limit in `tokens`, or -1 when every token is below it: one
// parallel pass for the largest id, then a scan for the offset (what the readers' vocabulary
// checks name in their messages).
int64_t first_token_at_or_above(TokenSpan tokens, int64_t limit);

class ShardReader {
 public:
  explicit ShardReader(const std::string& path);  // maps and validates; throws loom::Error
  ~ShardReader();
  ShardReader(ShardReader&& other) noexcept;
  ShardReader& operator=(ShardReader&& other) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t num_tokens() const { return num_tokens_; }
  int width() const { return width_; }                                 // bytes per token: 2 or 4
  TokenSpan tokens() const { return {tokens_, num_tokens_, width_}; }  // read-only

 private:
  void unmap();

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  int64_t num_tokens_ = 0;
  int width_ = 2;
};

}  // namespace loom
