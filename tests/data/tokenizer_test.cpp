// tests/data/tokenizer_test.cpp — GPT-2 BPE: every reference case of
// testdata/gpt2_tokenizer_cases.jsonl exactly, decode(encode(x)) == x, the special token only
// when allowed, the pre-tokenizer's splits, arbitrary (invalid UTF-8) bytes, load errors, and
// the encode throughput (printed, never asserted).
#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/data/data_test_util.h"

namespace loom {
namespace {

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<Case> load_cases() {
  std::ifstream in(data_test::cases_path());
  EXPECT_TRUE(in.good()) << "missing " << data_test::cases_path();
  std::vector<Case> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    cases.push_back({j.at("text").get<std::string>(), j.at("ids").get<std::vector<int32_t>>()});
  }
  return cases;
}

class TokenizerTest : public ::testing::Test {
 protected:
  Tokenizer& gpt2() { return tok_; }
  Tokenizer tok_{data_test::bpe_dir()};
};

TEST_F(TokenizerTest, LoadsGpt2Tables) {
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().eot_id(), 50256);
}

TEST_F(TokenizerTest, EveryReferenceCase) {
  const std::vector<Case> cases = load_cases();
  ASSERT_EQ(cases.size(), 231u);
  Tokenizer fresh(data_test::bpe_dir());  // cold cache, and the shared one warm: same answers
  for (size_t i = 0; i < cases.size(); ++i) {
    // The reference ids were made with the special token allowed (see testdata/README.md).
    EXPECT_EQ(fresh.encode(cases[i].text, true), cases[i].ids)
        << "case " << i << ": " << cases[i].text;
    EXPECT_EQ(gpt2().encode(cases[i].text, true), cases[i].ids) << "case " << i;
    if (cases[i].text.find("<|endoftext|>") == std::string::npos) {
      EXPECT_EQ(gpt2().encode(cases[i].text), cases[i].ids) << "case " << i;
    }
  }
}

TEST_F(TokenizerTest, DecodeInvertsEncode) {
  for (const Case& c : load_cases()) {
    EXPECT_EQ(gpt2().decode(gpt2().encode(c.text)), c.text);
    EXPECT_EQ(gpt2().decode(gpt2().encode(c.text, true)), c.text);
    EXPECT_EQ(gpt2().decode(c.ids), c.text);
  }
}

TEST_F(TokenizerTest, SpecialTokenOnlyWhenAllowed) {
  const std::string text = "a<|endoftext|>b<|endoftext|>";
  const std::vector<int32_t> allowed = gpt2().encode(text, true);
  EXPECT_EQ(allowed, (std::vector<int32_t>{64, 50256, 65, 50256}));
  const std::vector<int32_t> plain = gpt2().encode(text);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_GT(plain.size(), allowed.size());
  EXPECT_EQ(gpt2().decode(plain), text);
  EXPECT_EQ(gpt2().decode(allowed), text);
  EXPECT_EQ(gpt2().encode("<|endoftext|>", true), (std::vector<int32_t>{50256}));
}

TEST(Pretokenizer, Splits) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(gpt2_pretokenize("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(gpt2_pretokenize("hello  world   "), (V{"hello", " ", " world", "   "}));
  EXPECT_EQ(gpt2_pretokenize("I'm DON'T 'sa"), (V{"I", "'m", " DON", "'", "T", " '", "sa"}));
  EXPECT_EQ(gpt2_pretokenize("x123 4.5!!?"), (V{"x", "123", " 4", ".", "5", "!!?"}));
  EXPECT_EQ(gpt2_pretokenize("a\n\n b\n"), (V{"a", "\n\n", " b", "\n"}));
  EXPECT_EQ(gpt2_pretokenize("a\t\nb"), (V{"a", "\t", "\n", "b"}));
  EXPECT_EQ(gpt2_pretokenize("caf\xC3\xA9 \xE2\x85\xA7"), (V{"caf\xC3\xA9", " \xE2\x85\xA7"}));
  EXPECT_EQ(gpt2_pretokenize("x\xC2\xA0y"), (V{"x", "\xC2\xA0", "y"}));  // NBSP is \s
  EXPECT_TRUE(gpt2_pretokenize("").empty());
}

TEST_F(TokenizerTest, ArbitraryBytesRoundTrip) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes += static_cast<char>(i);
  bytes += "\xC3 \xE2\x82 \xED\xA0\x80 \xF4\x90\x80\x80 \xC0\xAF end";  // invalid UTF-8
  EXPECT_EQ(gpt2().decode(gpt2().encode(bytes)), bytes);
}

TEST_F(TokenizerTest, LongWordsRoundTrip) {
  // Long words (past the cache's size limit) go through the heap merge every time.
  std::string word;
  for (int i = 0; i < 20000; ++i) word += static_cast<char>('a' + (i * 7 + i / 13) % 26);
  const std::vector<int32_t> ids = gpt2().encode(word);
  EXPECT_EQ(gpt2().decode(ids), word);
  EXPECT_EQ(gpt2().encode(word), ids);
}

TEST_F(TokenizerTest, DecodeRejectsBadIds) {
  try {
    gpt2().decode(std::vector<int32_t>{1, 50257});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 50257 at position 1"), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerTest, LoadErrorsNameTheFile) {
  data_test::TempDir dir;
  data_test::write_bytes(dir.file("encoder.json"), "{\"a\": 0,");
  data_test::write_bytes(dir.file("vocab.bpe"), "#version: 0.2\n");
  try {
    Tokenizer t(dir.path().string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("encoder.json: invalid JSON"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(find_bpe_dir(dir.file("nope")), Error);
  EXPECT_EQ(find_bpe_dir(data_test::bpe_dir()), data_test::bpe_dir());
}

TEST_F(TokenizerTest, EncodeThroughput) {
  std::string corpus;
  for (const Case& c : load_cases()) corpus += c.text + "\n";
  std::string big;
  while (big.size() < (size_t{4} << 20)) big += corpus;
  Tokenizer& tok = gpt2();
  const auto time = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const size_t n = tok.encode(big).size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GT(n, big.size() / 8);
    return big.size() / 1e6 / s;
  };
  const double cold = time();  // the first pass fills the word cache
  const double warm = time();
  std::printf(
      "[ tokenizer ] encode %.1f MB of English text: %.1f MB/s (first pass), "
      "%.1f MB/s (warm word cache)\n",
      big.size() / 1e6, cold, warm);
  RecordProperty("encode_mb_per_s_warm", std::to_string(warm));
}

}  // namespace
}  // namespace loom
