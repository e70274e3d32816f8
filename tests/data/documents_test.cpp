// tests/data/documents_test.cpp — document shards (data/documents.h): the .docs byte layout, the
// write/read round trip, what write_document_shard refuses, the named one-line InputError for each
// kind of damaged or mismatched pair (missing, truncated, trailing bytes, magic, version, count
// mismatch with the .bin, offsets, mask values, first-token mask), and check_vocab's message.
#include "data/documents.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include "core/crc32c.h"
#include "core/error.h"
#include "tests/data/data_test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <typename T>
T read_at(const std::string& bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

template <typename T>
void write_at(std::string& bytes, size_t offset, T v) {
  std::memcpy(bytes.data() + offset, &v, sizeof(T));
}

// Three documents of 3, 1 and 4 tokens.
struct Sample {
  std::vector<int32_t> tokens = {50256, 10, 11, 50256, 50256, 20, 21, 22};
  std::vector<uint8_t> mask = {0, 0, 1, 0, 0, 1, 1, 0};
  std::vector<int64_t> offsets = {0, 3, 4, 8};
};

// Expects DocumentReader(shard) to throw an InputError that starts with `file` and contains every
// fragment, on one line.
void expect_docs_error(const std::string& shard, const std::string& file,
                       const std::vector<std::string>& fragments) {
  try {
    DocumentReader r(shard);
    ADD_FAILURE() << shard << ": no error";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(file + ": ", 0), 0u) << "error does not start with " << file << ": " << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}

TEST(Documents, SidecarPath) {
  EXPECT_EQ(docs_path_for("dir/train_000000.bin"), "dir/train_000000.docs");
  EXPECT_EQ(docs_path_for("a.bin.bin"), "a.bin.docs");
  EXPECT_EQ(docs_path_for("noext"), "noext.docs");
}

TEST(Documents, RoundTripAndLayout) {
  data_test::TempDir dir;
  const Sample s;
  const std::string bin = dir.file("train_000000.bin");
  EXPECT_FALSE(has_document_index(bin));
  write_document_shard(bin, s.tokens, s.mask, s.offsets);
  EXPECT_TRUE(has_document_index(bin));
  EXPECT_FALSE(fs::exists(bin + ".tmp"));
  EXPECT_FALSE(fs::exists(dir.file("train_000000.docs.tmp")));

  // The byte layout, read by hand.
  const std::string bytes = read_all(dir.file("train_000000.docs"));
  ASSERT_EQ(bytes.size(), 1024u + 8 * 4 + 8);
  EXPECT_EQ(read_at<int32_t>(bytes, 0), 20241205);
  EXPECT_EQ(read_at<int32_t>(bytes, 4), 2);
  EXPECT_EQ(read_at<int32_t>(bytes, 8), 3);
  EXPECT_EQ(read_at<int32_t>(bytes, 12), 8);
  // [4]: the .bin's token checksum, CRC-32C of the block CRCs (one block here).
  const std::vector<uint16_t> u16(s.tokens.begin(), s.tokens.end());
  const uint32_t block = crc32c(u16.data(), 2 * u16.size());
  EXPECT_EQ(read_at<uint32_t>(bytes, 16), crc32c(&block, 4));
  EXPECT_EQ(read_at<uint32_t>(bytes, 16),
            shard_token_checksum(TokenSpan(u16.data(), static_cast<int64_t>(u16.size()), 2)));
  for (size_t i = 20; i < 1024; ++i) ASSERT_EQ(bytes[i], 0) << "header byte " << i;
  for (size_t d = 0; d < 4; ++d) EXPECT_EQ(read_at<int64_t>(bytes, 1024 + 8 * d), s.offsets[d]);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(static_cast<uint8_t>(bytes[1056 + i]), s.mask[i]);
  // The .bin is an ordinary shard.
  ShardReader shard(bin);
  ASSERT_EQ(shard.num_tokens(), 8);
  EXPECT_EQ(shard.tokens()[5], 20);

  DocumentReader r(bin);
  EXPECT_EQ(r.path(), bin);
  EXPECT_EQ(r.docs_path(), dir.file("train_000000.docs"));
  ASSERT_EQ(r.num_docs(), 3);
  EXPECT_EQ(r.num_tokens(), 8);
  EXPECT_EQ(r.num_loss_tokens(), 3);
  const std::vector<std::vector<uint16_t>> want_tokens = {
      {50256, 10, 11}, {50256}, {50256, 20, 21, 22}};
  const std::vector<std::vector<uint8_t>> want_mask = {{0, 0, 1}, {0}, {0, 1, 1, 0}};
  for (int64_t d = 0; d < 3; ++d) {
    EXPECT_EQ(r.doc_begin(d), s.offsets[d]);
    EXPECT_EQ(r.doc_length(d), s.offsets[d + 1] - s.offsets[d]);
    const auto t = r.doc_tokens(d);
    const auto m = r.doc_mask(d);
    const std::vector<int32_t> got = t.to_vector();
    EXPECT_EQ(std::vector<uint16_t>(got.begin(), got.end()), want_tokens[d]) << "document " << d;
    EXPECT_EQ(std::vector<uint8_t>(m.begin(), m.end()), want_mask[d]) << "document " << d;
  }
  EXPECT_EQ(std::vector<int64_t>(r.offsets().begin(), r.offsets().end()), s.offsets);
  DocumentReader moved = std::move(r);  // the mappings move with the reader
  EXPECT_EQ(moved.doc_tokens(2)[3], 22);
  EXPECT_EQ(moved.doc_mask(0)[2], 1);
  DocumentReader other(bin);
  other = std::move(moved);
  EXPECT_EQ(other.num_docs(), 3);
  EXPECT_EQ(other.doc_tokens(0)[1], 10);
}

TEST(Documents, EmptyShard) {
  data_test::TempDir dir;
  write_document_shard(dir.file("e.bin"), {}, {}, std::vector<int64_t>{0});
  DocumentReader r(dir.file("e.bin"));
  EXPECT_EQ(r.num_docs(), 0);
  EXPECT_EQ(r.num_tokens(), 0);
}

TEST(Documents, WriterChecksItsInputs) {
  data_test::TempDir dir;
  const std::string bin = dir.file("w.bin");
  auto message = [&](const Sample& s) {
    try {
      write_document_shard(bin, s.tokens, s.mask, s.offsets);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto expect = [&](const Sample& s, const std::string& fragment) {
    const std::string msg = message(s);
    EXPECT_EQ(msg.rfind(bin + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(bin)) << "nothing written for: " << fragment;
  };
  Sample s;
  s.mask.pop_back();
  expect(s, "7 loss-mask values for 8 tokens");
  s = Sample{};
  s.offsets = {1, 3, 4, 8};
  expect(s, "must run from 0 to the token count 8");
  s.offsets = {0, 3, 4, 7};
  expect(s, "must run from 0 to the token count 8");
  s.offsets = {0, 4, 4, 8};
  expect(s, "document 1 is empty or reversed");
  s = Sample{};
  s.mask[6] = 2;
  expect(s, "loss-mask value 2 at token 6");
  s = Sample{};
  s.mask[3] = 1;
  expect(s, "document 1's first token has loss mask 1");
  s = Sample{};
  s.tokens[5] = 70000;
  expect(s, "token 70000 at index 5 does not fit");
  EXPECT_EQ(message(Sample{}), "no error");
}

// Writes a valid pair, applies `edit` to the .docs bytes, and returns the shard path.
std::string damaged(const data_test::TempDir& dir, const std::string& name,
                    const std::function<void(std::string&)>& edit) {
  const Sample s;
  const std::string bin = dir.file(name + ".bin");
  write_document_shard(bin, s.tokens, s.mask, s.offsets);
  std::string bytes = read_all(docs_path_for(bin));
  edit(bytes);
  data_test::write_bytes(docs_path_for(bin), bytes);
  return bin;
}

TEST(Documents, ReaderNamesEveryDamage) {
  data_test::TempDir dir;
  const auto docs = [&](const std::string& name) { return dir.file(name + ".docs"); };
  constexpr size_t kOffsets = 1024, kMask = 1024 + 8 * 4;

  expect_docs_error(damaged(dir, "trunc", [](std::string& b) { b.pop_back(); }), docs("trunc"),
                    {"truncated", "3 documents and 8 tokens (1064 bytes)", "file has 1063 bytes"});
  expect_docs_error(damaged(dir, "trail", [](std::string& b) { b += "xy"; }), docs("trail"),
                    {"2 trailing bytes"});
  expect_docs_error(damaged(dir, "tiny", [](std::string& b) { b.resize(100); }), docs("tiny"),
                    {"too small for a document index header", "100 bytes"});
  expect_docs_error(
      damaged(dir, "magic", [](std::string& b) { write_at<int32_t>(b, 0, 20240520); }),
      docs("magic"), {"bad magic 20240520", "not a document index"});
  expect_docs_error(damaged(dir, "version", [](std::string& b) { write_at<int32_t>(b, 4, 3); }),
                    docs("version"), {"unsupported document index version 3 (expected 2)"});
  expect_docs_error(damaged(dir, "count", [](std::string& b) { write_at<int32_t>(b, 12, 9); }),
                    docs("count"), {"header says 9 tokens", "holds 8"});
  expect_docs_error(
      damaged(dir, "flat", [&](std::string& b) { write_at<int64_t>(b, kOffsets + 16, 3); }),
      docs("flat"), {"offsets not increasing or out of range", "document 1 spans [3, 3)"});
  expect_docs_error(
      damaged(dir, "past", [&](std::string& b) { write_at<int64_t>(b, kOffsets + 16, 9); }),
      docs("past"), {"offsets not increasing or out of range", "document 1 spans [3, 9)"});
  expect_docs_error(
      damaged(dir, "start", [&](std::string& b) { write_at<int64_t>(b, kOffsets, 1); }),
      docs("start"), {"offsets[0] is 1"});
  expect_docs_error(
      damaged(dir, "short", [&](std::string& b) { write_at<int64_t>(b, kOffsets + 24, 7); }),
      docs("short"), {"offsets[3] is 7", "the token count 8"});
  expect_docs_error(damaged(dir, "mask2", [&](std::string& b) { b[kMask + 6] = 2; }), docs("mask2"),
                    {"loss-mask value 2 at token offset 6", "must be 0 or 1"});
  expect_docs_error(damaged(dir, "first", [&](std::string& b) { b[kMask + 4] = 1; }), docs("first"),
                    {"document 2 (offset 4) has loss mask 1 on its first token"});

  // A plain shard (no sidecar): the missing .docs is named.
  write_shard(dir.file("plain.bin"), std::vector<int32_t>{1, 2, 3});
  expect_docs_error(dir.file("plain.bin"), docs("plain"),
                    {"cannot open the document index of " + dir.file("plain.bin"), "No such file",
                     "plain token shard"});
  // The .bin was replaced by a shard with another count: the .docs no longer fits it.
  const std::string swapped = damaged(dir, "swapped", [](std::string&) {});
  write_shard(swapped, std::vector<int32_t>{50256, 1, 2});
  expect_docs_error(swapped, docs("swapped"), {"header says 8 tokens but " + swapped, "holds 3"});
  // A damaged .bin is named by the shard reader.
  const std::string badbin = damaged(dir, "badbin", [](std::string&) {});
  std::string bin_bytes = read_all(badbin);
  bin_bytes.pop_back();
  data_test::write_bytes(badbin, bin_bytes);
  expect_docs_error(badbin, badbin, {"truncated"});
}

// Found by trying to break it (issue 28): another shard's .docs with the same token count fitted
// every check, pairing the wrong documents and loss mask with the tokens. The header's checksum
// of the .bin ties the pair; a mismatch names both files. A version-1 sidecar (no checksum) is
// refused, saying to re-run prepare_data.
TEST(Documents, SidecarOfAnotherShardIsRefused) {
  data_test::TempDir dir;
  Sample a, b;
  b.tokens[1] = 12;  // same count and documents, one token differs
  write_document_shard(dir.file("a.bin"), a.tokens, a.mask, a.offsets);
  write_document_shard(dir.file("b.bin"), b.tokens, b.mask, b.offsets);
  EXPECT_NO_THROW(DocumentReader(dir.file("b.bin")));
  fs::copy_file(dir.file("a.docs"), dir.file("b.docs"), fs::copy_options::overwrite_existing);
  expect_docs_error(dir.file("b.bin"), dir.file("b.docs"),
                    {"written for another shard: it records the checksum of " + dir.file("b.bin"),
                     "but its tokens give", "the .docs belongs to another shard"});
  // The .bin rewritten in place (same count) is caught the same way.
  write_shard(dir.file("a.bin"), b.tokens);
  expect_docs_error(dir.file("a.bin"), dir.file("a.docs"), {"written for another shard"});

  const std::string old = damaged(dir, "v1", [](std::string& bytes) {
    write_at<int32_t>(bytes, 4, 1);
    write_at<uint32_t>(bytes, 16, 0);
  });
  expect_docs_error(old, docs_path_for(old),
                    {"document index version 1 has no checksum of its .bin (version 2 has): re-run "
                     "prepare_data --format chat to rewrite the shards"});
}

// A sidecar that cannot be written is named as the user's file (InputError, no source location).
TEST(Documents, UnwritableSidecarIsAnInputError) {
  data_test::TempDir dir;
  const Sample s;
  fs::create_directories(dir.file("x.docs/occupied"));  // rename onto a non-empty folder fails
  try {
    write_document_shard(dir.file("x.bin"), s.tokens, s.mask, s.offsets);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(
        std::string(e.what()).rfind(dir.file("x.docs") + ": cannot write document index: ", 0), 0u)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.file("x.docs.tmp")));
}

// The checksum is over 1 MiB blocks: a shard of several blocks, a change in any block (first,
// middle, last partial) changes it.
TEST(Documents, ChecksumCoversEveryBlock) {
  std::vector<uint16_t> t(1'300'000);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>(i * 7919);
  const uint32_t base =
      shard_token_checksum(TokenSpan(t.data(), static_cast<int64_t>(t.size()), 2));
  for (const size_t at : {size_t{0}, size_t{524'288}, t.size() - 1}) {
    std::vector<uint16_t> u = t;
    u[at] ^= 1;
    EXPECT_NE(shard_token_checksum(TokenSpan(u.data(), static_cast<int64_t>(u.size()), 2)), base)
        << at;
  }
  EXPECT_EQ(shard_token_checksum({}), 0u);
}

TEST(Documents, CheckVocabNamesDocumentAndOffset) {
  data_test::TempDir dir;
  Sample s;
  s.tokens = {5, 10, 11, 5, 5, 20, 300, 400};  // 300: document 2, position 2
  const std::string bin = dir.file("v.bin");
  write_document_shard(bin, s.tokens, s.mask, s.offsets);
  const DocumentReader r(bin);
  EXPECT_NO_THROW(r.check_vocab(50257));
  EXPECT_NO_THROW(r.check_vocab(401));
  try {
    r.check_vocab(256);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              bin +
                  ": token 300 at offset 6 (document 2, position 2 of its 4 tokens) is outside "
                  "model.vocab_size 256 (the shard was written for another vocabulary?)");
  }
}

}  // namespace
}  // namespace loom
