// data/tokenizer.h — BPE tokenizers: GPT-2's own files (encoder.json + vocab.bpe: GPT-2's regex
// pre-tokenizer implemented by hand over Unicode tables, the byte↔unicode alphabet) and Hugging
// Face tokenizer.json files (byte-level BPE with a regex pre-tokenizer — Llama 3, Qwen — and
// SentencePiece-style BPE with byte fallback — Llama 2, Mistral: Note [Hugging Face tokenizers]
// in data/hf_tokenizer.cpp); rank-ordered merges with a per-object word cache. It holds no
// global state; one Tokenizer per thread.
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
  // A Hugging Face tokenizer: `path` is a tokenizer.json or a directory holding one (and, when
  // present, tokenizer_config.json, whose bos_token and eos_token name BOS and the end of a
  // document). What it does not support is refused naming the field (loom::InputError).
  static Tokenizer from_hf(const std::string& path);
  // A copy for another thread: the same tables, its own scratch, word cache and regex matches.
  Tokenizer clone() const;
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // UTF-8 text → ids (no BOS: sequence_prefix() is the caller's). With allow_special, a special
  // token's text ("<|endoftext|>") becomes its id; without it, the same characters are encoded
  // as ordinary text (non-special added tokens are always found). Not const: it fills the word
  // cache.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false);
  void encode_append(std::string_view text, bool allow_special, std::vector<int32_t>& out);
  // ids → the exact bytes they stand for (not re-validated as UTF-8).
  std::string decode(std::span<const int32_t> ids) const;

  // One more than the largest id (50257 for GPT-2, 128256 for Llama 3).
  int32_t vocab_size() const;
  // The token that ends a document: "<|endoftext|>" (50256 for GPT-2); a Hugging Face
  // tokenizer's eos_token; -1 when it names none.
  int32_t eot_id() const;
  int32_t bos_id() const;  // the bos_token, -1 for none (GPT-2)
  // The ids the tokenizer's post-processor puts before and after a sequence (BOS for Llama);
  // empty for GPT-2.
  const std::vector<int32_t>& sequence_prefix() const;
  const std::vector<int32_t>& sequence_suffix() const;
  int32_t token_id(std::string_view added_token) const;  // an added token's id, -1 if none
  // A Hugging Face model's tokenizer_config.json: its Jinja chat_template (empty: none) and the
  // texts of its bos_token and eos_token (data/chat_jinja.h renders the template with them).
  const std::string& chat_template() const;
  const std::string& bos_text() const;
  const std::string& eos_text() const;
  const std::string& source() const;  // "gpt2 BPE DIR" or "hf:PATH"
  size_t cache_size() const;          // words memoised so far
  void clear_cache();

 private:
  Tokenizer();

 public:
  struct Impl;  // data/tokenizer_impl.h

 private:
  std::unique_ptr<Impl> impl_;
};

// "gpt2" (GPT-2's files: find_bpe_dir(bpe_dir)) or "hf:PATH" (Tokenizer::from_hf(PATH)); the
// option that named it (`--tokenizer`) in errors.
Tokenizer load_tokenizer(const std::string& spec, const std::string& bpe_dir = "");

// The directory holding encoder.json and vocab.bpe. First match wins: `explicit_dir` (when not
// empty), $LOOM_BPE_DIR, data/gpt2-bpe in the running executable's directory or one of its
// parents, then this source tree's data/gpt2-bpe. Throws naming the places it looked.
std::string find_bpe_dir(const std::string& explicit_dir = "");

}  // namespace loom
