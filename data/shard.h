// data/shard.h — the token shard format of llm.c / nanoGPT: a header of 256 little-endian int32
// (magic 20240520, version 1, token count, the rest zero) followed by the tokens as uint16.
// write_shard writes one atomically; ShardReader memory-maps one read-only and validates it,
// naming the file and the problem in every error. Nothing here tokenizes or shuffles.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace loom {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;  // uint16 tokens
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// Writes `tokens` to `path` (via path.tmp, then rename). Every token must fit in uint16 (else
// loom::Error: the caller's bug); a file that cannot be written is a loom::InputError naming it.
void write_shard(const std::string& path, std::span<const int32_t> tokens);
void write_shard(const std::string& path, std::span<const uint16_t> tokens);

// The offset of the first token ≥ limit in `tokens`, or -1 when every token is below it: one
// parallel pass for the largest id, then a scan for the offset (what the readers' vocabulary
// checks name in their messages).
int64_t first_token_at_or_above(std::span<const uint16_t> tokens, int64_t limit);

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
  const uint16_t* tokens() const { return tokens_; }  // num_tokens() values, read-only
  std::span<const uint16_t> span() const { return {tokens_, static_cast<size_t>(num_tokens_)}; }

 private:
  void unmap();

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t num_tokens_ = 0;
};

}  // namespace loom
