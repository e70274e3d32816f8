// data/tokenizer_impl.h — what a Tokenizer holds, shared by data/tokenizer.cpp (the encoding
// pipeline, the BPE merge loop and GPT-2's own files) and data/hf_tokenizer.cpp (Hugging Face
// tokenizer.json). Internal to data/: nothing outside includes it.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace loom {

// The merge ranks: an open-addressing table (linear probing, Fibonacci hashing) keyed by the
// pair (left id << 32 | right id). Lookups are the inner loop of BPE.
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0, merged = 0;
  };
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  void reserve(size_t n);  // call once, before any insert
  // Like GPT-2's dict(zip(merges, range(...))): a repeated pair keeps its last rank.
  void insert_or_assign(uint64_t k, int32_t rank, int32_t merged);
  const Entry* find(uint64_t k) const {
    for (size_t i = slot(k);; i = (i + 1) & mask()) {
      if (slots_[i].key == k) return &slots_[i];
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  size_t mask() const { return slots_.size() - 1; }
  size_t slot(uint64_t k) const {
    return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> (64 - bits_));
  }
  std::vector<Entry> slots_;
  int bits_ = 0;
  size_t size_ = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// A compiled PCRE2 pattern (UTF, Unicode properties, JIT where available) with its match data.
struct Regex {
  std::shared_ptr<pcre2_code_8> code;
  std::shared_ptr<pcre2_match_data_8> match;
};

struct Tokenizer::Impl {
  // ---- the model: BPE over an alphabet.
  // kBytes: byte-level (GPT-2, Llama 3, Qwen): a word's symbols are its bytes. kChars:
  // SentencePiece-style (Llama 2, Mistral 7B): its characters, a character the vocabulary lacks
  // as its bytes' <0xXX> tokens (byte_fallback) or the unknown token.
  enum class Alphabet { kBytes, kChars };
  Alphabet alphabet = Alphabet::kBytes;
  std::vector<std::string> id_bytes;        // id → the bytes it decodes to
  std::vector<std::string> id_first_bytes;  // as a text's first token, where that differs
  std::array<int32_t, 256> byte_id{};       // kBytes: each byte's symbol; kChars: its <0xXX> or -1
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>
      piece_id;  // kBytes: a
                 // piece's bytes → id; kChars: its characters → id
  MergeTable merges;
  int32_t unk = -1;
  bool fuse_unk = false, ignore_merges = false;

  // ---- around it (Note [Hugging Face tokenizers] in data/hf_tokenizer.cpp).
  struct NormStep {
    enum Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kPrepend, kReplace } kind;
    std::string a, b;  // kPrepend: a; kReplace: a → b
  };
  std::vector<NormStep> normalizer;
  struct PreStep {
    enum Kind { kGpt2, kSplit, kMetaspace } kind;
    Regex regex;              // kSplit: the pieces and the gaps between them, each its own
    std::string replacement;  // kMetaspace: spaces → replacement (▁)
    bool prepend_first = false, prepend_always = false, split = false;  // kMetaspace
    bool add_prefix_space = false;  // kGpt2 (ByteLevel): a space before a text not starting so
  };
  std::vector<PreStep> pre;  // empty: a segment is one word
  struct AddedToken {
    std::string content;
    int32_t id;
    bool special, lstrip, rstrip;
  };
  std::vector<AddedToken> added;        // matched in the raw text, longest first
  std::array<bool, 256> added_first{};  // the first bytes of added tokens
  std::vector<int32_t> prefix, suffix;  // the post-processor's ids around a sequence
  bool strip_leading_space = false;     // the decoder drops the decoded text's first space
  int32_t eot = -1, bos = -1;
  std::string bos_text, eos_text, chat_template;  // from tokenizer_config.json
  std::string source;                             // what was loaded ("gpt2 BPE DIR", "hf:PATH")

  // ---- scratch (one Tokenizer per thread).
  struct Sym {  // one symbol of the word being merged, in a linked list
    int32_t id, prev, next;
  };
  struct Cand {  // a mergeable adjacent pair (left symbol at pos)
    int32_t rank, pos, left, right, merged;
  };
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;
  std::vector<Sym> syms;
  std::vector<Cand> heap, pending;
  std::vector<int32_t> initial;

  void add_cand(std::vector<Cand>& v, int32_t a, int32_t b) const;
  void bpe(const std::vector<int32_t>& symbols, std::vector<int32_t>& out);
  void encode_word(std::string_view word, std::vector<int32_t>& out);
  void encode_segment(std::string_view text, bool at_start, std::vector<int32_t>& out);
  void pre_tokenize(size_t step, std::string_view text, bool at_start,
                    const std::function<void(std::string_view)>& emit);
  void encode(std::string_view text, bool allow_special, std::vector<int32_t>& out);
  void index_added();  // after `added` is filled: longest first, first bytes
};

// The bytes a GPT-2 byte-level alphabet string stands for; false when a character is outside
// the alphabet.
bool alphabet_to_bytes(std::string_view s, std::string& bytes);
// Text transforms of the normalizers (data/hf_tokenizer.cpp).
std::string normalize_text(const std::vector<Tokenizer::Impl::NormStep>& steps,
                           std::string_view text);

}  // namespace loom
