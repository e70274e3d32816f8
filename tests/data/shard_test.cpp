// tests/data/shard_test.cpp — llm.c token shards: the byte layout, write/read round trips, and
// the named one-line error for each kind of corrupt file (missing, too small, bad magic, bad
// version, truncated, trailing bytes) and for tokens that do not fit uint16.
#include "data/shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "tests/data/data_test_util.h"

namespace loom {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A valid shard's bytes with header fields overridden.
std::string shard_bytes(int32_t magic, int32_t version, int32_t count, size_t token_bytes) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(token_bytes, '\x01');
  return bytes;
}

// Expects ShardReader(path) to throw a loom::Error whose message contains every fragment.
void expect_shard_error(const std::string& path, const std::vector<std::string>& fragments) {
  try {
    ShardReader r(path);
    ADD_FAILURE() << path << ": no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << "error does not start with the path: " << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}

TEST(Shard, RoundTripAndLayout) {
  data_test::TempDir dir;
  const std::vector<int32_t> tokens = {0, 1, 50256, 65535, 42, 7};
  write_shard(dir.file("a.bin"), tokens);
  const std::string bytes = read_all(dir.file("a.bin"));
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 6);
  EXPECT_FALSE(std::filesystem::exists(dir.file("a.bin.tmp")));

  ShardReader r(dir.file("a.bin"));
  EXPECT_EQ(r.path(), dir.file("a.bin"));
  ASSERT_EQ(r.num_tokens(), 6);
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(r.tokens()[i], tokens[i]);
  ShardReader moved = std::move(r);  // the mapping moves with the reader
  EXPECT_EQ(moved.tokens()[2], 50256);
}

TEST(Shard, EmptyAndUint16Shards) {
  data_test::TempDir dir;
  write_shard(dir.file("empty.bin"), std::vector<int32_t>{});
  EXPECT_EQ(ShardReader(dir.file("empty.bin")).num_tokens(), 0);
  const std::vector<uint16_t> u16 = {9, 8, 7};
  write_shard(dir.file("u16.bin"), std::span<const uint16_t>(u16));
  EXPECT_EQ(ShardReader(dir.file("u16.bin")).tokens()[1], 8);
}

// Vocabularies over 65,536 (Llama 3's 128,256): llm.c's uint32 shards (magic 20240801, version
// 7), read back alike; the width a vocabulary needs.
TEST(Shard, Uint32ShardsForLargeVocabularies) {
  data_test::TempDir dir;
  const std::vector<int32_t> tokens = {128000, 9906, 1917, 128001, 70000, 0};
  write_shard(dir.file("w.bin"), tokens, 4);
  std::ifstream in(dir.file("w.bin"), std::ios::binary);
  int32_t header[3];
  in.read(reinterpret_cast<char*>(header), sizeof header);
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  EXPECT_EQ(header[2], 6);
  EXPECT_EQ(std::filesystem::file_size(dir.file("w.bin")), 1024u + 4 * tokens.size());
  ShardReader r(dir.file("w.bin"));
  EXPECT_EQ(r.width(), 4);
  EXPECT_EQ(r.tokens().to_vector(), tokens);
  EXPECT_EQ(first_token_at_or_above(r.tokens(), 128001), 3);
  EXPECT_EQ(first_token_at_or_above(r.tokens(), 128002), -1);
  int32_t window[3];
  r.tokens().subspan(2, 3).copy_to(window);
  EXPECT_EQ(window[0], 1917);
  EXPECT_EQ(window[2], 70000);
  EXPECT_EQ(shard_width(50257), 2);
  EXPECT_EQ(shard_width(65536), 2);
  EXPECT_EQ(shard_width(128256), 4);
  // A uint16 shard's magic with a uint32 shard's version is refused, naming both.
  std::ifstream whole(dir.file("w.bin"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(whole)), std::istreambuf_iterator<char>());
  const int32_t magic16 = 20240520;
  std::memcpy(bytes.data(), &magic16, 4);
  data_test::write_bytes(dir.file("bad.bin"), bytes);
  try {
    ShardReader bad(dir.file("bad.bin"));
    ADD_FAILURE() << "a version that does not go with the magic must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported shard version 7"), std::string::npos)
        << e.what();
  }
}

TEST(Shard, RejectsTokensOutsideUint16) {
  data_test::TempDir dir;
  try {
    write_shard(dir.file("x.bin"), std::vector<int32_t>{1, 65536});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 65536 at index 1"), std::string::npos);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.bin")));
}

// Found by trying to break it (issue 28): a shard that cannot be written (a missing or
// unwritable --out-dir) is the user's file: an InputError naming it, with no source location.
TEST(Shard, UnwritableShardIsAnInputError) {
  data_test::TempDir dir;
  const std::string path = dir.file("no/such/dir/x.bin");
  try {
    write_shard(path, std::vector<int32_t>{1, 2});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": cannot write shard: No such file or directory");
  }
}

TEST(Shard, CorruptFilesGiveNamedErrors) {
  data_test::TempDir dir;
  expect_shard_error(dir.file("missing.bin"), {"cannot open shard"});

  data_test::write_bytes(dir.file("small.bin"), std::string(100, '\0'));
  expect_shard_error(dir.file("small.bin"), {"too small for a shard header", "100 bytes"});

  data_test::write_bytes(dir.file("magic.bin"), shard_bytes(12345, 1, 4, 8));
  expect_shard_error(dir.file("magic.bin"), {"bad magic 12345", "20240520"});

  data_test::write_bytes(dir.file("version.bin"), shard_bytes(20240520, 7, 4, 8));
  expect_shard_error(dir.file("version.bin"), {"unsupported shard version 7"});

  data_test::write_bytes(dir.file("trunc.bin"), shard_bytes(20240520, 1, 1000, 476));
  expect_shard_error(dir.file("trunc.bin"),
                     {"truncated: header says 1000 tokens (2000 bytes + 1024 header = 3024 bytes)",
                      "file has 1500 bytes"});

  data_test::write_bytes(dir.file("long.bin"), shard_bytes(20240520, 1, 4, 10));
  expect_shard_error(dir.file("long.bin"), {"2 trailing bytes", "header says 4 tokens"});

  data_test::write_bytes(dir.file("neg.bin"), shard_bytes(20240520, 1, -3, 0));
  expect_shard_error(dir.file("neg.bin"), {"negative token count -3"});
}

}  // namespace
}  // namespace loom
