// data/hf_tokenizer.cpp — a Hugging Face tokenizer.json (the `tokenizers` library's format) read
// into a Tokenizer (Note [Hugging Face tokenizers]); the normalizers' text transforms (NFC & co.
// by utf8proc); load_tokenizer.
#include <utf8proc.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/tokenizer_impl.h"

namespace loom {

// Note [Hugging Face tokenizers]: a tokenizer.json is a pipeline — added tokens, normalizer,
// pre-tokenizer, model, post-processor, decoder — and Loom runs the parts BPE models use:
//   added_tokens   found in the raw text before anything else, leftmost and longest (special
//                  ones only when encode's allow_special is set; non-special ones always),
//                  lstrip/rstrip taking the whitespace beside them; single_word is refused.
//   normalizer     null, NFC/NFD/NFKC/NFKD and Lowercase (utf8proc; per code point, so a Greek
//                  final capital sigma lowers to σ, not ς), Prepend, Replace of a
//                  String, a Sequence of them — applied to each stretch of text between added
//                  tokens (as the library does, so a Prepend("▁") normalizer prefixes each).
//   pre_tokenizer  null (the stretch is one word), Split with a Regex or String pattern and
//                  behavior Isolated (matches and the gaps between them are the words; PCRE2,
//                  UTF with Unicode properties, standing in for the library's Oniguruma), ByteLevel
//                  (use_regex: GPT-2's pattern, by hand; add_prefix_space), Metaspace (spaces →
//                  its replacement, prepended per prepend_scheme first|always|never, split or
//                  not), a Sequence of them.
//   model          BPE: vocab and merges ("a b" strings or [a, b] pairs), byte_fallback (a
//                  character outside the vocabulary as its bytes' <0xXX> tokens), unk_token and
//                  fuse_unk, ignore_merges (a word the vocabulary holds whole is that token); the
//                  alphabet is bytes when a ByteLevel pre-tokenizer or decoder is present (a
//                  token's string in GPT-2's byte alphabet), else characters.
//   post_processor null, ByteLevel, TemplateProcessing's `single` (its special tokens before and
//                  after $A: sequence_prefix/suffix), a Sequence of them.
//   decoder        ByteLevel; Metaspace; a Sequence of Replace (▁ → " "), ByteFallback, Fuse and
//                  Strip (at most one leading space): each token's bytes, the first space of the
//                  text dropped where Strip says so; Metaspace (prepend_scheme first or always)
//                  drops every ▁ of the first token, as the library does.
// Anything else is refused naming its field. tokenizer_config.json beside it gives bos_token
// and eos_token (eot_id: the end of a document).

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// GPT-2's byte ↔ unicode alphabet, bytes → the code point standing for each.
uint32_t byte_to_cp(int b) {
  int n = 0;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
    if (x == b) return printable ? static_cast<uint32_t>(x) : static_cast<uint32_t>(256 + n);
    if (!printable) ++n;
  }
  return 0;
}

std::string utf8(uint32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}
  const std::string& path() const { return path_; }

  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    LOOM_INPUT_FAIL(path_, ": ", field, ": ", why);
  }
  const json& at(const json& j, const std::string& key, const std::string& field) const {
    if (!j.is_object() || !j.contains(key)) fail(field, "missing");
    return j.at(key);
  }
  std::string str(const json& j, const std::string& key, const std::string& field) const {
    const json& v = at(j, key, field);
    if (!v.is_string()) fail(field, "expected a string");
    return v.get<std::string>();
  }
  bool flag(const json& j, const std::string& key, const std::string& field,
            bool fallback = false) const {
    if (!j.is_object() || !j.contains(key) || j.at(key).is_null()) return fallback;
    if (!j.at(key).is_boolean()) fail(field, "expected true or false");
    return j.at(key).get<bool>();
  }
  std::string type(const json& j, const std::string& field) const {
    return str(j, "type", field + ".type");
  }

 private:
  std::string path_;
};

Regex compile(const Reader& r, const std::string& pattern, const std::string& field) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code_8* code =
      pcre2_compile_8(reinterpret_cast<PCRE2_SPTR8>(pattern.data()), pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR8 msg[256];
    pcre2_get_error_message_8(err, msg, sizeof(msg));
    r.fail(field, "the pattern does not compile at offset " + std::to_string(offset) + " (" +
                      reinterpret_cast<const char*>(msg) + ")");
  }
  pcre2_jit_compile_8(code, PCRE2_JIT_COMPLETE);  // without a JIT, the interpreter matches
  Regex out;
  out.code.reset(code, pcre2_code_free_8);
  out.match.reset(pcre2_match_data_create_from_pattern_8(code, nullptr), pcre2_match_data_free_8);
  return out;
}

// A literal string as a pattern.
std::string quote(const std::string& s) { return "\\Q" + s + "\\E"; }

void read_normalizer(const Reader& r, const json& j, const std::string& field,
                     std::vector<Tokenizer::Impl::NormStep>& out) {
  using N = Tokenizer::Impl::NormStep;
  if (j.is_null()) return;
  const std::string t = r.type(j, field);
  if (t == "Sequence") {
    const json& list = r.at(j, "normalizers", field + ".normalizers");
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(r, list[i], field + ".normalizers[" + std::to_string(i) + "]", out);
  } else if (t == "NFC") {
    out.push_back({N::kNfc, "", ""});
  } else if (t == "NFD") {
    out.push_back({N::kNfd, "", ""});
  } else if (t == "NFKC") {
    out.push_back({N::kNfkc, "", ""});
  } else if (t == "NFKD") {
    out.push_back({N::kNfkd, "", ""});
  } else if (t == "Lowercase") {
    out.push_back({N::kLowercase, "", ""});
  } else if (t == "Prepend") {
    out.push_back({N::kPrepend, r.str(j, "prepend", field + ".prepend"), ""});
  } else if (t == "Replace") {
    const json& pat = r.at(j, "pattern", field + ".pattern");
    if (!pat.contains("String")) r.fail(field + ".pattern", "only a String pattern is supported");
    out.push_back({N::kReplace, r.str(pat, "String", field + ".pattern.String"),
                   r.str(j, "content", field + ".content")});
  } else {
    r.fail(field + ".type", "'" + t + "' is not supported");
  }
}

// Returns whether a ByteLevel step is present.
bool read_pre(const Reader& r, const json& j, const std::string& field,
              std::vector<Tokenizer::Impl::PreStep>& out) {
  using P = Tokenizer::Impl::PreStep;
  if (j.is_null()) return false;
  const std::string t = r.type(j, field);
  if (t == "Sequence") {
    const json& list = r.at(j, "pretokenizers", field + ".pretokenizers");
    bool byte_level = false;
    for (size_t i = 0; i < list.size(); ++i)
      byte_level |= read_pre(r, list[i], field + ".pretokenizers[" + std::to_string(i) + "]", out);
    return byte_level;
  }
  if (t == "Split") {
    const json& pat = r.at(j, "pattern", field + ".pattern");
    std::string pattern;
    if (pat.contains("Regex"))
      pattern = r.str(pat, "Regex", field + ".pattern.Regex");
    else
      pattern = quote(r.str(pat, "String", field + ".pattern.String"));
    const std::string behavior = r.str(j, "behavior", field + ".behavior");
    if (behavior != "Isolated")
      r.fail(field + ".behavior", "'" + behavior + "' is not supported (Isolated)");
    if (r.flag(j, "invert", field + ".invert")) r.fail(field + ".invert", "true is not supported");
    P p{P::kSplit, compile(r, pattern, field + ".pattern"), "", false, false, false, false};
    out.push_back(std::move(p));
    return false;
  }
  if (t == "ByteLevel") {
    if (r.flag(j, "use_regex", field + ".use_regex", true) ||
        r.flag(j, "add_prefix_space", field + ".add_prefix_space")) {
      out.push_back({P::kGpt2,
                     {},
                     "",
                     false,
                     false,
                     false,
                     r.flag(j, "add_prefix_space", field + ".add_prefix_space")});
      if (!r.flag(j, "use_regex", field + ".use_regex", true))
        r.fail(field + ".add_prefix_space", "true without use_regex is not supported");
    }
    return true;
  }
  if (t == "Metaspace") {
    P p{P::kMetaspace, {},   r.str(j, "replacement", field + ".replacement"), false, false,
        false,         false};
    std::string scheme = "always";
    if (j.contains("prepend_scheme")) {
      scheme = r.str(j, "prepend_scheme", field + ".prepend_scheme");
    } else if (!r.flag(j, "add_prefix_space", field + ".add_prefix_space", true)) {
      scheme = "never";
    }
    if (scheme == "first")
      p.prepend_first = true;
    else if (scheme == "always")
      p.prepend_always = true;
    else if (scheme != "never")
      r.fail(field + ".prepend_scheme", "'" + scheme + "' is not first, always or never");
    p.split = r.flag(j, "split", field + ".split", true);
    out.push_back(std::move(p));
    return false;
  }
  r.fail(field + ".type", "'" + t + "' is not supported");
}

// The decoder: whether it is byte-level, decodes byte fallback and ▁, and drops a first space.
struct DecoderShape {
  bool byte_level = false, byte_fallback = false, strip_first = false, metaspace_first = false;
  std::string space_from;  // a Replace's or Metaspace's replacement, decoded as " "
};

void read_decoder(const Reader& r, const json& j, const std::string& field, DecoderShape& d) {
  if (j.is_null()) return;
  const std::string t = r.type(j, field);
  if (t == "Sequence") {
    const json& list = r.at(j, "decoders", field + ".decoders");
    for (size_t i = 0; i < list.size(); ++i)
      read_decoder(r, list[i], field + ".decoders[" + std::to_string(i) + "]", d);
  } else if (t == "ByteLevel") {
    d.byte_level = true;
  } else if (t == "ByteFallback") {
    d.byte_fallback = true;
  } else if (t == "Fuse") {
  } else if (t == "Replace") {
    const json& pat = r.at(j, "pattern", field + ".pattern");
    if (!pat.contains("String") || r.str(j, "content", field + ".content") != " ")
      r.fail(field, "only Replace of a String by \" \" is supported");
    d.space_from = r.str(pat, "String", field + ".pattern.String");
  } else if (t == "Strip") {
    const json& start = r.at(j, "start", field + ".start");
    const json& stop = r.at(j, "stop", field + ".stop");
    if (r.str(j, "content", field + ".content") != " " || !start.is_number_integer() ||
        start.get<int64_t>() > 1 || !stop.is_number_integer() || stop.get<int64_t>() != 0)
      r.fail(field, "only Strip of at most one leading \" \" is supported");
    d.strip_first = start.get<int64_t>() == 1;
  } else if (t == "Metaspace") {
    d.space_from = r.str(j, "replacement", field + ".replacement");
    const std::string scheme =
        j.contains("prepend_scheme") ? r.str(j, "prepend_scheme", field + ".prepend_scheme")
        : r.flag(j, "add_prefix_space", field + ".add_prefix_space", true) ? "always"
                                                                           : "never";
    d.metaspace_first = scheme != "never";
  } else {
    r.fail(field + ".type", "'" + t + "' is not supported");
  }
}

void read_post(const Reader& r, const json& j, const std::string& field, Tokenizer::Impl& im) {
  if (j.is_null()) return;
  const std::string t = r.type(j, field);
  if (t == "Sequence") {
    const json& list = r.at(j, "processors", field + ".processors");
    for (size_t i = 0; i < list.size(); ++i)
      read_post(r, list[i], field + ".processors[" + std::to_string(i) + "]", im);
  } else if (t == "ByteLevel") {
  } else if (t == "TemplateProcessing") {
    const json& single = r.at(j, "single", field + ".single");
    const json& tokens = r.at(j, "special_tokens", field + ".special_tokens");
    bool after = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string f = field + ".single[" + std::to_string(i) + "]";
      if (single[i].contains("Sequence")) {
        after = true;
        continue;
      }
      const std::string name =
          r.str(r.at(single[i], "SpecialToken", f), "id", f + ".SpecialToken.id");
      const json& ids = r.at(r.at(tokens, name, field + ".special_tokens." + name), "ids",
                             field + ".special_tokens." + name + ".ids");
      for (const json& id : ids) {
        if (!id.is_number_integer()) r.fail(field + ".special_tokens." + name, "ids not integers");
        (after ? im.suffix : im.prefix).push_back(id.get<int32_t>());
      }
    }
  } else {
    r.fail(field + ".type", "'" + t + "' is not supported");
  }
}

// A token named by tokenizer_config.json: a string, or {"content": string}.
std::string config_token(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const json& v = cfg.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string())
    return v.at("content").get<std::string>();
  return "";
}

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_INPUT_CHECK(in.good(), path, ": cannot open it");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    LOOM_INPUT_FAIL(path, ": not valid JSON (", e.what(), ")");
  }
}

}  // namespace

std::string normalize_text(const std::vector<Tokenizer::Impl::NormStep>& steps,
                           std::string_view text) {
  using N = Tokenizer::Impl::NormStep;
  std::string s(text);
  for (const N& n : steps) {
    switch (n.kind) {
      case N::kPrepend:
        if (!s.empty()) s = n.a + s;
        break;
      case N::kReplace: {
        if (n.a.empty()) break;
        std::string out;
        size_t at = 0;
        for (size_t k; (k = s.find(n.a, at)) != std::string::npos; at = k + n.a.size())
          out.append(s, at, k - at).append(n.b);
        s = out.append(s, at, std::string::npos);
        break;
      }
      default: {  // by utf8proc, over each valid UTF-8 stretch (other bytes kept as they are)
        int options = UTF8PROC_STABLE;
        if (n.kind == N::kNfc) options |= UTF8PROC_COMPOSE;
        if (n.kind == N::kNfd) options |= UTF8PROC_DECOMPOSE;
        if (n.kind == N::kNfkc) options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        if (n.kind == N::kNfkd) options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        if (n.kind == N::kLowercase) {  // each code point's lowercase (not case folding: ß stays)
          std::string out;
          utf8proc_int32_t cp;
          for (size_t at = 0; at < s.size();) {
            const auto len =
                utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data()) + at,
                                 static_cast<utf8proc_ssize_t>(s.size() - at), &cp);
            if (len <= 0) {  // an invalid byte, kept
              out += s[at++];
              continue;
            }
            out += utf8(static_cast<uint32_t>(utf8proc_tolower(cp)));
            at += static_cast<size_t>(len);
          }
          s = std::move(out);
          break;
        }
        std::string out;
        size_t at = 0;
        while (at < s.size()) {
          size_t end = at;  // the valid stretch from `at`
          while (end < s.size()) {
            utf8proc_int32_t cp;
            const auto len =
                utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data()) + end,
                                 static_cast<utf8proc_ssize_t>(s.size() - end), &cp);
            if (len <= 0) break;
            end += static_cast<size_t>(len);
          }
          if (end > at) {
            utf8proc_uint8_t* mapped = nullptr;
            const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()) + at,
                                          static_cast<utf8proc_ssize_t>(end - at), &mapped,
                                          static_cast<utf8proc_option_t>(options));
            LOOM_CHECK(len >= 0, "normalizer: ", utf8proc_errmsg(len));
            out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(len));
            std::free(mapped);
          }
          if (end < s.size()) out += s[end++];  // an invalid byte
          at = end;
        }
        s = std::move(out);
      }
    }
  }
  return s;
}

Tokenizer Tokenizer::from_hf(const std::string& path) {
  std::error_code ec;
  const fs::path file =
      fs::is_directory(path, ec) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  const Reader r(file.string());
  const json j = read_json(file.string());
  Tokenizer tok;
  Impl& im = *tok.impl_;
  im.source = "hf:" + path;

  const json& model = r.at(j, "model", "model");
  const std::string model_type = model.is_object() && model.contains("type")
                                     ? r.str(model, "type", "model.type")
                                     : std::string("BPE");
  if (model_type != "BPE") r.fail("model.type", "'" + model_type + "' is not supported (BPE only)");
  if (model.contains("dropout") && !model.at("dropout").is_null())
    r.fail("model.dropout", "BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model.at(key).is_null() && model.at(key) != "")
      r.fail(std::string("model.") + key, "is not supported");
  }
  read_normalizer(r, j.value("normalizer", json()), "normalizer", im.normalizer);
  const bool byte_level_pre =
      read_pre(r, j.value("pre_tokenizer", json()), "pre_tokenizer", im.pre);
  DecoderShape dec;
  read_decoder(r, j.value("decoder", json()), "decoder", dec);
  im.alphabet = byte_level_pre || dec.byte_level ? Impl::Alphabet::kBytes : Impl::Alphabet::kChars;
  const bool bytes = im.alphabet == Impl::Alphabet::kBytes;
  im.fuse_unk = r.flag(model, "fuse_unk", "model.fuse_unk");
  im.ignore_merges = r.flag(model, "ignore_merges", "model.ignore_merges");
  const bool byte_fallback = r.flag(model, "byte_fallback", "model.byte_fallback");

  // The vocabulary: a token's string → its bytes (byte-level) or as is (characters).
  const json& vocab = r.at(model, "vocab", "model.vocab");
  if (!vocab.is_object() || vocab.empty()) r.fail("model.vocab", "expected an object {token: id}");
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> by_string;
  int64_t max_id = -1;
  for (const auto& [key, value] : vocab.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0)
      r.fail("model.vocab", "the id of \"" + key + "\" is not a non-negative integer");
    max_id = std::max<int64_t>(max_id, value.get<int64_t>());
  }
  const json& added = j.value("added_tokens", json::array());
  for (const json& a : added) max_id = std::max<int64_t>(max_id, a.value("id", int64_t{-1}));
  im.id_bytes.assign(static_cast<size_t>(max_id + 1), std::string());
  if (dec.metaspace_first) im.id_first_bytes.assign(im.id_bytes.size(), std::string());
  im.byte_id.fill(-1);
  // What a token's string decodes to: its bytes (byte-level), else ▁ as a space and <0xXX> as
  // its byte (where the decoder says so); `first`: as the first token of a text, whose ▁ the
  // Metaspace decoder drops (all of them, as the library does).
  const auto decoded = [&](const std::string& token, bool first) {
    std::string b;
    if (bytes) return alphabet_to_bytes(token, b) ? b : token;
    if (dec.byte_fallback && token.size() == 6 && token.starts_with("<0x") && token.back() == '>')
      return std::string(1, static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16)));
    const std::string& from = dec.space_from;
    if (from.empty()) return token;
    for (size_t at = 0;;) {
      const size_t k = token.find(from, at);
      b.append(token, at, k == std::string::npos ? std::string::npos : k - at);
      if (k == std::string::npos) break;
      if (!(first && dec.metaspace_first)) b += ' ';
      at = k + from.size();
    }
    return b;
  };
  for (const auto& [key, value] : vocab.items()) {
    const auto id = value.get<int32_t>();
    by_string[key] = id;
    std::string b = key;
    if (bytes && !alphabet_to_bytes(key, b))
      r.fail("model.vocab", "\"" + key + "\" has a character outside the byte-level alphabet");
    im.piece_id[b] = id;
    if (!bytes && byte_fallback && key.size() == 6 && key.starts_with("<0x") && key.back() == '>')
      im.byte_id[std::stoi(key.substr(3, 2), nullptr, 16)] = id;
  }
  for (const auto& [key, id] : by_string) {
    im.id_bytes[static_cast<size_t>(id)] = decoded(key, false);
    if (dec.metaspace_first) im.id_first_bytes[static_cast<size_t>(id)] = decoded(key, true);
  }
  if (bytes) {
    for (int v = 0; v < 256; ++v) {
      const auto it = im.piece_id.find(std::string(1, static_cast<char>(v)));
      if (it == im.piece_id.end())
        r.fail("model.vocab", "no token for byte " + std::to_string(v) + " (\"" +
                                  utf8(byte_to_cp(v)) + "\") in a byte-level vocabulary");
      im.byte_id[v] = it->second;
    }
  }
  if (model.contains("unk_token") && !model.at("unk_token").is_null()) {
    const std::string u = r.str(model, "unk_token", "model.unk_token");
    const auto it = by_string.find(u);
    if (it == by_string.end()) r.fail("model.unk_token", "\"" + u + "\" is not in the vocabulary");
    im.unk = it->second;
  }

  // The merges: "a b" or ["a", "b"], by rank.
  const json& merges = r.at(model, "merges", "model.merges");
  im.merges.reserve(merges.size());
  int32_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string f = "model.merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (merges[i].is_string()) {
      const std::string m = merges[i].get<std::string>();
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) r.fail(f, "expected \"left right\", got \"" + m + "\"");
      a = m.substr(0, sp);
      b = m.substr(sp + 1);
    } else if (merges[i].is_array() && merges[i].size() == 2 && merges[i][0].is_string() &&
               merges[i][1].is_string()) {
      a = merges[i][0].get<std::string>();
      b = merges[i][1].get<std::string>();
    } else {
      r.fail(f, "expected \"left right\" or [left, right]");
    }
    const auto ia = by_string.find(a), ib = by_string.find(b), im_ = by_string.find(a + b);
    if (ia == by_string.end() || ib == by_string.end() || im_ == by_string.end())
      r.fail(f, "\"" + a + " " + b + "\" uses or makes a token missing from model.vocab");
    im.merges.insert_or_assign(MergeTable::key(ia->second, ib->second), rank++, im_->second);
  }

  // Added tokens.
  for (size_t i = 0; i < added.size(); ++i) {
    const std::string f = "added_tokens[" + std::to_string(i) + "]";
    const json& a = added[i];
    const std::string content = r.str(a, "content", f + ".content");
    const json& id = r.at(a, "id", f + ".id");
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      r.fail(f + ".id", "not a non-negative integer");
    if (content.empty()) r.fail(f + ".content", "empty");
    if (r.flag(a, "single_word", f + ".single_word"))
      r.fail(f + ".single_word", "true is not supported");
    Impl::AddedToken t{content, id.get<int32_t>(), r.flag(a, "special", f + ".special"),
                       r.flag(a, "lstrip", f + ".lstrip"), r.flag(a, "rstrip", f + ".rstrip")};
    im.id_bytes[static_cast<size_t>(t.id)] = decoded(content, false);
    if (dec.metaspace_first) im.id_first_bytes[static_cast<size_t>(t.id)] = decoded(content, true);
    im.added.push_back(std::move(t));
  }
  im.index_added();
  read_post(r, j.value("post_processor", json()), "post_processor", im);
  im.strip_leading_space = dec.strip_first;

  // BOS and the end of a document from tokenizer_config.json, where there is one.
  const fs::path cfg_path = file.parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(cfg_path, ec)) {
    const json cfg = read_json(cfg_path.string());
    const std::string bos = config_token(cfg, "bos_token"), eos = config_token(cfg, "eos_token");
    im.bos_text = bos;
    im.eos_text = eos;
    // chat_template: a string, or named templates [{"name", "template"}] of which "default".
    if (cfg.contains("chat_template")) {
      const json& t = cfg.at("chat_template");
      if (t.is_string()) {
        im.chat_template = t.get<std::string>();
      } else if (t.is_array()) {
        for (const json& named : t)
          if (named.is_object() && named.value("name", "") == "default")
            im.chat_template = named.value("template", "");
      }
      LOOM_INPUT_CHECK(!im.chat_template.empty() || t.is_null(), cfg_path.string(),
                       ": chat_template: expected a string or a list holding a \"default\" one");
    }
    if (!bos.empty()) im.bos = tok.token_id(bos) >= 0 ? tok.token_id(bos) : -1;
    if (!eos.empty()) im.eot = tok.token_id(eos) >= 0 ? tok.token_id(eos) : -1;
    if (!eos.empty() && im.eot < 0) {
      const auto it = by_string.find(eos);
      LOOM_INPUT_CHECK(it != by_string.end(), cfg_path.string(), ": eos_token: \"", eos,
                       "\" is not a token of ", file.string());
      im.eot = it->second;
    }
  }
  return tok;
}

Tokenizer load_tokenizer(const std::string& spec, const std::string& bpe_dir) {
  if (spec.empty() || spec == "gpt2") return Tokenizer(find_bpe_dir(bpe_dir));
  LOOM_INPUT_CHECK(spec.starts_with("hf:") && spec.size() > 3, "--tokenizer: '", spec,
                   "' is not gpt2 or hf:PATH (a tokenizer.json or a directory holding one)");
  return Tokenizer::from_hf(spec.substr(3));
}

}  // namespace loom
