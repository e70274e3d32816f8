// data/tokenizer.cpp — the tokenizer's pipeline (added tokens, normalizer, pre-tokenizers, BPE
// with its merge loop and word cache), GPT-2's hand-written pre-tokenizer and byte alphabet, and
// GPT-2's own files (encoder.json/vocab.bpe). No std::regex and no global mutable state: every
// table and the word cache live in the Tokenizer's Impl (data/tokenizer_impl.h).
#include "data/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "data/tokenizer_impl.h"
#include "data/unicode_tables.h"

namespace loom {
namespace {

namespace ut = unicode_tables;
namespace fs = std::filesystem;

constexpr uint32_t kInvalidCp = 0xFFFFFFFFu;  // a byte that is not valid UTF-8
constexpr const char* kEotText = "<|endoftext|>";
constexpr size_t kMaxCacheEntries = size_t{1} << 20;  // cleared when full (bounded memory)
constexpr size_t kMaxCachedWordBytes = 256;

// ---------------------------------------------------------------------------------------------
// UTF-8 and code-point classes.

struct CodePoint {
  uint32_t cp;
  int len;      // bytes
  uint8_t cls;  // ut::CodeClass
};

uint8_t class_of(uint32_t cp) {
  if (cp < 128) return ut::kAsciiClass[cp];
  if (cp == kInvalidCp) return ut::kOther;
  const ut::CodeRange* end = ut::kRanges + ut::kNumRanges;
  const ut::CodeRange* it = std::upper_bound(
      ut::kRanges, end, cp, [](uint32_t v, const ut::CodeRange& r) { return v < r.lo; });
  if (it == ut::kRanges) return ut::kOther;
  --it;
  return cp <= it->hi ? it->cls : static_cast<uint8_t>(ut::kOther);
}

// Decodes the multi-byte code point at s[i] (strict UTF-8: no overlongs, surrogates or values
// > 0x10FFFF). An invalid byte decodes as kInvalidCp of length 1.
CodePoint decode_cp_multibyte(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c0 = b(i);
  const size_t left = s.size() - i;
  const auto cont = [&](size_t k, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return k < left && b(i + k) >= lo && b(i + k) <= hi;
  };
  uint32_t cp = kInvalidCp;
  int len = 1;
  if (c0 >= 0xC2 && c0 <= 0xDF && cont(1)) {
    cp = ((c0 & 0x1Fu) << 6) | (b(i + 1) & 0x3Fu);
    len = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF &&
             cont(1, c0 == 0xE0 ? 0xA0 : 0x80, c0 == 0xED ? 0x9F : 0xBF) && cont(2)) {
    cp = ((c0 & 0x0Fu) << 12) | ((b(i + 1) & 0x3Fu) << 6) | (b(i + 2) & 0x3Fu);
    len = 3;
  } else if (c0 >= 0xF0 && c0 <= 0xF4 &&
             cont(1, c0 == 0xF0 ? 0x90 : 0x80, c0 == 0xF4 ? 0x8F : 0xBF) && cont(2) && cont(3)) {
    cp = ((c0 & 0x07u) << 18) | ((b(i + 1) & 0x3Fu) << 12) | ((b(i + 2) & 0x3Fu) << 6) |
         (b(i + 3) & 0x3Fu);
    len = 4;
  }
  return {cp, len, class_of(cp)};
}

inline CodePoint decode_cp(std::string_view s, size_t i) {
  const auto c0 = static_cast<uint8_t>(s[i]);
  if (c0 < 0x80) [[likely]]
    return {c0, 1, ut::kAsciiClass[c0]};
  return decode_cp_multibyte(s, i);
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer. Note [GPT-2 pre-tokenizer]: at each position the regex tries, in order,
// contractions, ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`, `\s+(?!\S)`, `\s+`. Every
// non-space code point is exactly one of L, N, other, so a space followed by a non-space always
// joins the run after it; a whitespace run followed by a non-space yields all but its last code
// point (the lookahead backtracks by one), and a lone whitespace code point is its own token.

size_t class_run_end(std::string_view s, size_t i, uint8_t cls) {
  while (i < s.size()) {
    const auto c0 = static_cast<uint8_t>(s[i]);
    if (c0 < 0x80) {  // the common case, kept free of the multi-byte decoder
      if (ut::kAsciiClass[c0] != cls) break;
      ++i;
      continue;
    }
    const CodePoint c = decode_cp_multibyte(s, i);
    if (c.cls != cls) break;
    i += static_cast<size_t>(c.len);
  }
  return i;
}

size_t contraction_len(std::string_view s, size_t i) {  // s[i] == '\''
  const std::string_view rest = s.substr(i + 1);
  if (rest.empty()) return 0;
  const char c = rest[0];
  if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
  if (rest.size() >= 2 &&
      (rest.starts_with("re") || rest.starts_with("ve") || rest.starts_with("ll"))) {
    return 3;
  }
  return 0;
}

// End (exclusive) of the pre-token that starts at s[i] (i < s.size()).
size_t pretoken_end(std::string_view s, size_t i) {
  const CodePoint c = decode_cp(s, i);
  if (c.cp == '\'') {
    if (const size_t n = contraction_len(s, i)) return i + n;
  }
  if (c.cp == ' ' && i + 1 < s.size()) {
    const CodePoint d = decode_cp(s, i + 1);
    if (d.cls != ut::kSpace) return class_run_end(s, i + 1, d.cls);
  }
  if (c.cls != ut::kSpace) return class_run_end(s, i, c.cls);
  size_t end = i, last = i;
  while (end < s.size()) {
    const CodePoint w = decode_cp(s, end);
    if (w.cls != ut::kSpace) break;
    last = end;
    end += static_cast<size_t>(w.len);
  }
  if (end == s.size()) return end;  // \s+(?!\S) at the end of the text
  return last > i ? last : end;     // all but the last code point, or a lone one (\s+)
}

// ---------------------------------------------------------------------------------------------
// GPT-2's byte ↔ unicode alphabet: printable Latin-1 bytes map to themselves, the other 68 bytes
// to U+0100.. in byte order.

constexpr std::array<int16_t, 324> make_unicode_to_byte() {
  std::array<int16_t, 324> map{};
  for (auto& m : map) m = -1;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    map[printable ? b : 256 + n++] = static_cast<int16_t>(b);
  }
  return map;
}
constexpr std::array<int16_t, 324> kUnicodeToByte = make_unicode_to_byte();

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), path, ": cannot open ", what);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < text.size();) {
    const size_t e = pretoken_end(text, i);
    out.push_back(text.substr(i, e - i));
    i = e;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The BPE core.

void MergeTable::reserve(size_t n) {
  bits_ = 4;
  while ((size_t{1} << bits_) < 2 * n) ++bits_;
  slots_.assign(size_t{1} << bits_, Entry{});
}

void MergeTable::insert_or_assign(uint64_t k, int32_t rank, int32_t merged) {
  size_t i = slot(k);
  while (slots_[i].key != kEmpty && slots_[i].key != k) i = (i + 1) & mask();
  if (slots_[i].key == kEmpty) ++size_;
  slots_[i] = {k, rank, merged};
}

void Tokenizer::Impl::add_cand(std::vector<Cand>& v, int32_t a, int32_t b) const {
  const int32_t left = syms[a].id, right = syms[b].id;
  if (const MergeTable::Entry* e = merges.find(MergeTable::key(left, right))) {
    v.push_back({e->rank, a, left, right, e->merged});
  }
}

// Note [BPE merge order]: GPT-2 repeatedly takes the lowest-ranked adjacent pair and merges all
// its occurrences left to right. A min-heap of (rank, position) gives the same result in
// O(n log n): each round pops every candidate of the current rank in position order (stale ones,
// whose symbols changed, are skipped) and only then admits the pairs the round created. (The
// `tokenizers` library admits them at once; the results agree, since a merge only creates pairs
// holding the merged symbol, which cannot be the pair being merged.)
void Tokenizer::Impl::bpe(const std::vector<int32_t>& symbols, std::vector<int32_t>& out) {
  const auto n = static_cast<int32_t>(symbols.size());
  syms.resize(static_cast<size_t>(n));
  for (int32_t k = 0; k < n; ++k) syms[k] = {symbols[k], k - 1, k + 1 < n ? k + 1 : -1};
  const auto later = [](const Cand& x, const Cand& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  heap.clear();
  for (int32_t k = 0; k + 1 < n; ++k) add_cand(heap, k, k + 1);
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    const int32_t rank = heap.front().rank;
    pending.clear();
    while (!heap.empty() && heap.front().rank == rank) {
      std::pop_heap(heap.begin(), heap.end(), later);
      const Cand c = heap.back();
      heap.pop_back();
      Sym& l = syms[c.pos];
      if (l.id != c.left || l.next < 0 || syms[l.next].id != c.right) continue;  // stale
      Sym& r = syms[l.next];
      l.id = c.merged;
      l.next = r.next;
      r.id = -1;
      if (l.next >= 0) syms[l.next].prev = c.pos;
      if (l.prev >= 0) add_cand(pending, l.prev, c.pos);
      if (l.next >= 0) add_cand(pending, c.pos, l.next);
    }
    for (const Cand& c : pending) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), later);
    }
  }
  if (n > 0)
    for (int32_t k = 0; k >= 0; k = syms[k].next) out.push_back(syms[k].id);
}

void Tokenizer::Impl::encode_word(std::string_view word, std::vector<int32_t>& out) {
  if (word.empty()) return;
  if (alphabet == Alphabet::kBytes && word.size() == 1) {
    out.push_back(byte_id[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (ignore_merges) {  // a word the vocabulary holds whole is that token
    if (const auto it = piece_id.find(word); it != piece_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (const auto it = cache.find(word); it != cache.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  initial.clear();
  if (alphabet == Alphabet::kBytes) {
    for (const char c : word) initial.push_back(byte_id[static_cast<uint8_t>(c)]);
  } else {
    for (size_t i = 0; i < word.size();) {
      const auto len = static_cast<size_t>(decode_cp(word, i).len);
      const std::string_view ch = word.substr(i, len);
      i += len;
      if (const auto it = piece_id.find(ch); it != piece_id.end()) {
        initial.push_back(it->second);
        continue;
      }
      bool fallback = true;  // the bytes' <0xXX> tokens, when the vocabulary has all of them
      for (const char c : ch) fallback = fallback && byte_id[static_cast<uint8_t>(c)] >= 0;
      if (fallback) {
        for (const char c : ch) initial.push_back(byte_id[static_cast<uint8_t>(c)]);
      } else {
        LOOM_CHECK(unk >= 0, source, ": the character \"", ch,
                   "\" is not in the vocabulary and there is no unk_token or byte fallback");
        if (!(fuse_unk && !initial.empty() && initial.back() == unk)) initial.push_back(unk);
      }
    }
  }
  const size_t start = out.size();
  bpe(initial, out);
  if (word.size() > kMaxCachedWordBytes) return;
  if (cache.size() >= kMaxCacheEntries) cache.clear();
  cache.emplace(std::string(word), std::vector<int32_t>(out.begin() + start, out.end()));
}

// ---------------------------------------------------------------------------------------------
// The pipeline: added tokens, normalizer, pre-tokenizer, model (Note [Hugging Face tokenizers]
// in data/hf_tokenizer.cpp; GPT-2's own files are the case of no normalizer, GPT-2's
// pre-tokenizer and one special token).

void Tokenizer::Impl::pre_tokenize(size_t step, std::string_view text, bool at_start,
                                   const std::function<void(std::string_view)>& emit) {
  if (step == pre.size()) {
    emit(text);
    return;
  }
  const PreStep& p = pre[step];
  const auto next = [&](std::string_view piece, bool first) {
    pre_tokenize(step + 1, piece, first, emit);
  };
  switch (p.kind) {
    case PreStep::kGpt2: {
      if (p.add_prefix_space && !text.empty() && text[0] != ' ') {
        const std::string spaced = " " + std::string(text);
        for (size_t i = 0; i < spaced.size();) {
          const size_t e = pretoken_end(spaced, i);
          next(std::string_view(spaced).substr(i, e - i), at_start && i == 0);
          i = e;
        }
        return;
      }
      for (size_t i = 0; i < text.size();) {
        const size_t e = pretoken_end(text, i);
        next(text.substr(i, e - i), at_start && i == 0);
        i = e;
      }
      return;
    }
    case PreStep::kSplit: {  // the matches and the gaps between them, each a piece
      const auto* subject = reinterpret_cast<PCRE2_SPTR8>(text.data());
      size_t at = 0;
      while (at < text.size()) {
        const int rc = pcre2_match_8(p.regex.code.get(), subject, text.size(), at,
                                     PCRE2_NO_UTF_CHECK, p.regex.match.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        LOOM_CHECK(rc > 0, source, ": pre_tokenizer Split: the pattern failed to match (PCRE2 ", rc,
                   ")");
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer_8(p.regex.match.get());
        size_t b = ov[0], e = ov[1];
        if (e == b) {  // an empty match: not a piece; move on by one character
          at = b + static_cast<size_t>(b < text.size() ? decode_cp(text, b).len : 1);
          continue;
        }
        if (b > at) next(text.substr(at, b - at), at_start && at == 0);
        next(text.substr(b, e - b), at_start && b == 0);
        at = e;
      }
      if (at < text.size()) next(text.substr(at), at_start && at == 0);
      return;
    }
    case PreStep::kMetaspace: {
      std::string m;
      if (p.prepend_always || (p.prepend_first && at_start)) {
        if (!text.starts_with(p.replacement) && !text.starts_with(" ")) m = p.replacement;
      }
      for (const char c : text) {
        if (c == ' ')
          m += p.replacement;
        else
          m += c;
      }
      if (!p.split) {
        next(m, at_start);
        return;
      }
      // Each piece starts at a replacement character (the text before the first one is its own).
      std::string_view v = m;
      size_t begin = 0;
      for (size_t i = p.replacement.size(); i <= v.size(); ++i) {
        if (i == v.size() || v.substr(i).starts_with(p.replacement)) {
          if (i > begin) next(v.substr(begin, i - begin), at_start && begin == 0);
          begin = i;
          if (i == v.size()) break;
          i += p.replacement.size() - 1;
        }
      }
      return;
    }
  }
}

void Tokenizer::Impl::encode_segment(std::string_view text, bool at_start,
                                     std::vector<int32_t>& out) {
  if (text.empty()) return;
  const std::string normalized =
      normalizer.empty() ? std::string() : normalize_text(normalizer, text);
  const std::string_view t = normalizer.empty() ? text : std::string_view(normalized);
  if (pre.empty()) {
    encode_word(t, out);
    return;
  }
  pre_tokenize(0, t, at_start, [&](std::string_view word) { encode_word(word, out); });
}

void Tokenizer::Impl::index_added() {
  std::stable_sort(added.begin(), added.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  added_first.fill(false);
  for (const AddedToken& t : added) added_first[static_cast<uint8_t>(t.content[0])] = true;
}

// Added tokens are found in the raw text, leftmost then longest (special ones only with
// allow_special); the text between them is encoded segment by segment, lstrip/rstrip taking the
// whitespace beside a token into it.
void Tokenizer::Impl::encode(std::string_view text, bool allow_special, std::vector<int32_t>& out) {
  size_t seg = 0;  // start of the current segment
  bool strip_next = false;
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  for (size_t i = 0; i < text.size(); ++i) {
    if (!added_first[static_cast<uint8_t>(text[i])]) continue;
    const AddedToken* hit = nullptr;
    for (const AddedToken& t : added) {
      if ((t.special && !allow_special) || !text.substr(i).starts_with(t.content)) continue;
      hit = &t;
      break;
    }
    if (hit == nullptr) continue;
    size_t seg_end = i;
    if (strip_next)
      while (seg < seg_end && is_space(text[seg])) ++seg;
    if (hit->lstrip)
      while (seg_end > seg && is_space(text[seg_end - 1])) --seg_end;
    encode_segment(text.substr(seg, seg_end - seg), seg == 0, out);
    out.push_back(hit->id);
    i += hit->content.size();
    seg = i;
    strip_next = hit->rstrip;
    --i;
  }
  if (strip_next)
    while (seg < text.size() && is_space(text[seg])) ++seg;
  encode_segment(text.substr(seg), seg == 0, out);
}

// ---------------------------------------------------------------------------------------------
// GPT-2's files: encoder.json (token → id) and vocab.bpe (the merges).

namespace {

void load_encoder(Tokenizer::Impl& im, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path, "encoder.json"));
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL(path, ": invalid JSON: ", e.what());
  }
  LOOM_CHECK(j.is_object() && !j.empty(), path, ": expected a JSON object {token: id}");
  im.id_bytes.assign(j.size(), std::string());
  std::vector<bool> seen(j.size(), false);
  for (const auto& [key, value] : j.items()) {
    LOOM_CHECK(value.is_number_integer(), path, ": id of token \"", key, "\" is not an integer");
    const int64_t id = value.get<int64_t>();
    LOOM_CHECK(id >= 0 && id < static_cast<int64_t>(j.size()) && !seen[id], path, ": token \"", key,
               "\" has id ", id, ", not a unique id in [0, ", j.size(), ")");
    seen[id] = true;
    std::string bytes;
    LOOM_CHECK(alphabet_to_bytes(key, bytes), path, ": token \"", key,
               "\" has a character outside GPT-2's byte alphabet");
    if (key == kEotText) {
      im.eot = static_cast<int32_t>(id);  // special: never reachable by merging text
      im.added.push_back({key, im.eot, true, false, false});
    } else {
      im.piece_id[bytes] = static_cast<int32_t>(id);
    }
    im.id_bytes[id] = key == kEotText ? key : std::move(bytes);
  }
  LOOM_CHECK(im.eot >= 0, path, ": no ", kEotText, " token");
  for (int b = 0; b < 256; ++b) {
    const auto it = im.piece_id.find(std::string(1, static_cast<char>(b)));
    LOOM_CHECK(it != im.piece_id.end(), path, ": no token for byte ", b);
    im.byte_id[b] = it->second;
  }
}

void load_merges(Tokenizer::Impl& im, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), path, ": cannot open vocab.bpe");
  const auto to_bytes = [&](std::string_view s, int64_t line_no) {
    std::string bytes;
    LOOM_CHECK(alphabet_to_bytes(s, bytes), path, ":", line_no,
               ": character outside GPT-2's byte alphabet");
    return bytes;
  };
  const auto id_of = [&](const std::string& bytes, int64_t line_no, std::string_view line) {
    const auto it = im.piece_id.find(bytes);
    LOOM_CHECK(it != im.piece_id.end(), path, ":", line_no, ": merge \"", line,
               "\" uses or makes a token missing from encoder.json");
    return it->second;
  };
  std::string line;
  int64_t line_no = 0;
  int32_t rank = 0;
  std::vector<MergeTable::Entry> pairs;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const size_t sp = line.find(' ');
    LOOM_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() &&
                   line.find(' ', sp + 1) == std::string::npos,
               path, ":", line_no, ": expected \"left right\", got \"", line, "\"");
    const std::string left = to_bytes(std::string_view(line).substr(0, sp), line_no);
    const std::string right = to_bytes(std::string_view(line).substr(sp + 1), line_no);
    const int32_t a = id_of(left, line_no, line), b = id_of(right, line_no, line);
    const int32_t m = id_of(left + right, line_no, line);
    pairs.push_back({MergeTable::key(a, b), rank++, m});
  }
  LOOM_CHECK(!pairs.empty(), path, ": no merges");
  im.merges.reserve(pairs.size());
  for (const auto& e : pairs) im.merges.insert_or_assign(e.key, e.rank, e.merged);
}

}  // namespace

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}

Tokenizer::Tokenizer(const std::string& bpe_dir)
    : Tokenizer((fs::path(bpe_dir) / "encoder.json").string(),
                (fs::path(bpe_dir) / "vocab.bpe").string()) {}

Tokenizer::Tokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path)
    : impl_(std::make_unique<Impl>()) {
  load_encoder(*impl_, encoder_json_path);
  load_merges(*impl_, vocab_bpe_path);
  impl_->pre.push_back({Impl::PreStep::kGpt2, {}, "", false, false, false, false});
  impl_->index_added();
  impl_->source = "gpt2 BPE " + fs::path(encoder_json_path).parent_path().string();
}

Tokenizer Tokenizer::clone() const {
  Tokenizer t;
  *t.impl_ = *impl_;
  t.impl_->cache.clear();
  for (Impl::PreStep& p : t.impl_->pre) {
    if (p.regex.code) {
      p.regex.match.reset(pcre2_match_data_create_from_pattern_8(p.regex.code.get(), nullptr),
                          pcre2_match_data_free_8);
    }
  }
  return t;
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  encode_append(text, allow_special, out);
  return out;
}

void Tokenizer::encode_append(std::string_view text, bool allow_special,
                              std::vector<int32_t>& out) {
  impl_->encode(text, allow_special, out);
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  const auto n = static_cast<int32_t>(impl_->id_bytes.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    LOOM_CHECK(ids[i] >= 0 && ids[i] < n, "Tokenizer::decode: id ", ids[i], " at position ", i,
               " is outside the vocabulary [0, ", n, ")");
    const auto id = static_cast<size_t>(ids[i]);
    out +=
        i == 0 && !impl_->id_first_bytes.empty() ? impl_->id_first_bytes[id] : impl_->id_bytes[id];
  }
  if (impl_->strip_leading_space && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_bytes.size()); }
int32_t Tokenizer::eot_id() const { return impl_->eot; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
const std::vector<int32_t>& Tokenizer::sequence_prefix() const { return impl_->prefix; }
const std::vector<int32_t>& Tokenizer::sequence_suffix() const { return impl_->suffix; }
int32_t Tokenizer::token_id(std::string_view content) const {
  for (const Impl::AddedToken& t : impl_->added)
    if (t.content == content) return t.id;
  return -1;
}
const std::string& Tokenizer::source() const { return impl_->source; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::bos_text() const { return impl_->bos_text; }
const std::string& Tokenizer::eos_text() const { return impl_->eos_text; }
size_t Tokenizer::cache_size() const { return impl_->cache.size(); }
void Tokenizer::clear_cache() { impl_->cache.clear(); }

// ---------------------------------------------------------------------------------------------

// A token string of encoder.json / vocab.bpe → the bytes it stands for; false when a character is
// outside the alphabet.
bool alphabet_to_bytes(std::string_view s, std::string& bytes) {
  bytes.clear();
  for (size_t i = 0; i < s.size();) {
    const CodePoint c = decode_cp(s, i);
    if (c.cp >= kUnicodeToByte.size() || kUnicodeToByte[c.cp] < 0) return false;
    bytes += static_cast<char>(kUnicodeToByte[c.cp]);
    i += static_cast<size_t>(c.len);
  }
  return true;
}

namespace {
bool has_bpe_files(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "encoder.json", ec) &&
         fs::is_regular_file(dir / "vocab.bpe", ec);
}
}  // namespace

std::string find_bpe_dir(const std::string& explicit_dir) {
  if (!explicit_dir.empty()) {
    LOOM_CHECK(has_bpe_files(explicit_dir), explicit_dir,
               ": not a BPE directory (needs encoder.json and vocab.bpe)");
    return explicit_dir;
  }
  if (const char* env = std::getenv("LOOM_BPE_DIR"); env != nullptr && *env != '\0') {
    LOOM_CHECK(has_bpe_files(env), "LOOM_BPE_DIR=", env,
               ": not a BPE directory (needs encoder.json and vocab.bpe)");
    return env;
  }
  std::vector<fs::path> tried;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = exe.parent_path(); tried.size() < 5; dir = dir.parent_path()) {
      tried.push_back(dir / "data" / "gpt2-bpe");
      if (has_bpe_files(tried.back())) return tried.back().string();
      if (dir == dir.parent_path()) break;
    }
  }
  // This file is data/tokenizer.cpp of the source tree; its tables sit next to it.
  tried.push_back(fs::path(__FILE__).parent_path() / "gpt2-bpe");
  if (has_bpe_files(tried.back())) return tried.back().string();
  std::string places;
  for (const auto& p : tried) places += (places.empty() ? "" : ", ") + p.string();
  LOOM_FAIL(
      "cannot find the GPT-2 BPE files (encoder.json, vocab.bpe): pass --bpe-dir DIR or "
      "set LOOM_BPE_DIR (looked in ",
      places, ")");
}

}  // namespace loom
