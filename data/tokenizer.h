// data/tokenizer.h — GPT-2 byte-level BPE (encoder.json + vocab.bpe): the pre-tokenizer (GPT-2's
// regex, implemented by hand over Unicode tables), the byte↔unicode alphabet, and rank-ordered
// merges with a per-object word cache. It holds no global state; one Tokenizer per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// The spans (into `text`) that GPT-2's pre-tokenization regex yields, in order:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Bytes that are not valid UTF-8 count as one 'other' code point each, so any byte string
// pre-tokenizes (and, byte-level, encodes) losslessly.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

class Tokenizer {
 public:
  // Reads bpe_dir/encoder.json and bpe_dir/vocab.bpe.
  explicit Tokenizer(const std::string& bpe_dir);
  Tokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // UTF-8 text → ids. With allow_special, "<|endoftext|>" becomes eot_id(); without it, the same
  // characters are encoded as ordinary text. Not const: it fills the word cache.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false);
  void encode_append(std::string_view text, bool allow_special, std::vector<int32_t>& out);
  // ids → the exact bytes they stand for (not re-validated as UTF-8).
  std::string decode(std::span<const int32_t> ids) const;

  int32_t vocab_size() const;  // 50257 for GPT-2
  int32_t eot_id() const;      // id of "<|endoftext|>" (50256 for GPT-2)
  size_t cache_size() const;   // words memoised so far
  void clear_cache();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The directory holding encoder.json and vocab.bpe. First match wins: `explicit_dir` (when not
// empty), $LOOM_BPE_DIR, data/gpt2-bpe in the running executable's directory or one of its
// parents, then this source tree's data/gpt2-bpe. Throws naming the places it looked.
std::string find_bpe_dir(const std::string& explicit_dir = "");

}  // namespace loom
