// tests/layers/llmc_format_test.cpp — llm.c GPT-2 model files: header and layout, round trips
// (f32 bit-exact, bf16 within bf16 rounding), config read-back, and corrupt files giving errors
// that name the file and the problem.
#include "train/llmc_format.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/layers/tiny_models.h"

namespace loom {
namespace {

using testing::tiny_gpt2;

class LlmcFormat : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("loom_llmc_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const char* name) const { return (dir_ / name).string(); }

  static void init(Transformer& m, uint64_t seed) {
    Generator gen(seed);
    m.init_weights(gen);
    testing::perturb_parameters(m, 0.1, seed + 1);
  }

  std::filesystem::path dir_;
};

std::vector<char> read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& s : parts) {
      EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what() << "\nmissing: " << s;
    }
  }
}

TEST_F(LlmcFormat, HeaderAndLayout) {
  Transformer m(tiny_gpt2());
  init(m, 1);
  save_llmc_model(path("m.bin"), m, kLlmcVersionF32);
  const std::vector<char> bytes = read_all(path("m.bin"));
  const int64_t C = 8, L = 2, Vp = 12, T = 8;
  const int64_t count = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), 1024 + 4 * count);
  EXPECT_EQ(count, m.num_parameters());
  const int32_t* h = reinterpret_cast<const int32_t*>(bytes.data());
  EXPECT_EQ(std::vector<int32_t>(h, h + 9),
            (std::vector<int32_t>{20240326, 3, 8, 11, 2, 2, 8, 12, 0}));
  const float* p = reinterpret_cast<const float*>(bytes.data() + 1024);
  EXPECT_EQ(p[3], static_cast<float>(m.parameter("wte.weight").at({0, 3})));
  // qkvw of layer 1, row 17 (a k row of head 0... rows [8, 16) are k, [16, 24) v): after wte,
  // wpe, ln1w, ln1b (L·C each) and layer 0's (3C, C).
  const int64_t qkv1 = Vp * C + T * C + 2 * L * C + 3 * C * C;
  EXPECT_EQ(p[qkv1 + 17 * C + 5],
            static_cast<float>(m.parameter("blocks.1.attn.qkv.weight").at({17, 5})));
  const int64_t lnfb = count - C;
  EXPECT_EQ(p[lnfb + 7], static_cast<float>(m.parameter("ln_f.bias").at({7})));
}

TEST_F(LlmcFormat, F32RoundTripIsBitExact) {
  Transformer a(tiny_gpt2()), b(tiny_gpt2());
  init(a, 1);
  init(b, 2);
  save_llmc_model(path("m.bin"), a);
  load_llmc_model(path("m.bin"), b);
  for (auto& [name, p] : a.named_parameters()) {
    EXPECT_EQ(p.to_vector(), b.parameter(name).to_vector()) << name;
  }
  EXPECT_FALSE(std::filesystem::exists(path("m.bin.tmp")));
}

TEST_F(LlmcFormat, Bf16RoundTripWithinRounding) {
  Transformer a(tiny_gpt2()), b(tiny_gpt2(), DType::kF64);
  init(a, 1);
  save_llmc_model(path("m.bin"), a, kLlmcVersionBF16);
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(path("m.bin"))),
            1024 + 2 * a.num_parameters());
  load_llmc_model(path("m.bin"), b);  // into an f64 model
  for (auto& [name, p] : a.named_parameters()) {
    const std::vector<double> want = p.to(DType::kBF16).to(DType::kF32).to_vector();
    const std::vector<double> got = b.parameter(name).to_vector();
    EXPECT_EQ(got, want) << name;
    const std::vector<double> orig = p.to_vector();
    for (size_t i = 0; i < orig.size(); ++i) {
      EXPECT_LE(std::abs(got[i] - orig[i]), std::abs(orig[i]) * (1.0 / 256) + 1e-30) << name;
    }
  }
}

TEST_F(LlmcFormat, ReadConfig) {
  Transformer a(tiny_gpt2());
  init(a, 1);
  save_llmc_model(path("m.bin"), a);
  const ModelConfig c = read_llmc_config(path("m.bin"));
  EXPECT_EQ(c.arch, "gpt2");
  EXPECT_EQ(c.vocab_size, 11);
  EXPECT_EQ(c.padded_vocab(), 12);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_head, 2);
  EXPECT_EQ(c.n_embd, 8);
  EXPECT_EQ(c.max_seq_len, 8);
  EXPECT_TRUE(c.tie_embeddings);
  Transformer b(c);
  load_llmc_model(path("m.bin"), b);
  const Tensor ids = testing::random_ids(2, 5, 11, 3);
  EXPECT_EQ(a.forward(ids).to_vector(), b.forward(ids).to_vector());
  ModelConfig big;  // GPT-2 124M as llm.c pads it: Vp 50304 → vocab_multiple 128
  big.vocab_size = 50257;
  big.vocab_multiple = 128;
  EXPECT_EQ(big.padded_vocab(), 50304);
}

TEST_F(LlmcFormat, CorruptFilesGiveNamedErrors) {
  Transformer a(tiny_gpt2());
  init(a, 1);
  const std::string good = path("good.bin");
  save_llmc_model(good, a);
  const std::vector<char> bytes = read_all(good);
  auto patched = [&](const char* name, size_t int_index, int32_t value) {
    std::vector<char> b = bytes;
    std::memcpy(b.data() + 4 * int_index, &value, 4);
    write_all(path(name), b);
    return path(name);
  };
  const std::string magic = patched("magic.bin", 0, 12345);
  expect_error([&] { load_llmc_model(magic, a); }, {magic, "magic 12345"});
  expect_error([&] { read_llmc_config(magic); }, {magic, "not an llm.c model file"});
  const std::string version = patched("version.bin", 1, 4);
  expect_error([&] { load_llmc_model(version, a); },
               {version, "unsupported llm.c model version 4"});
  // Claiming bf16 for an f32 file: the size no longer matches the header.
  const std::string v5 = patched("v5.bin", 1, 5);
  expect_error([&] { load_llmc_model(v5, a); }, {v5, "bytes but its header"});
  std::vector<char> cut(bytes.begin(), bytes.end() - 4);
  write_all(path("truncated.bin"), cut);
  expect_error([&] { load_llmc_model(path("truncated.bin"), a); },
               {path("truncated.bin"), "bytes but its header"});
  write_all(path("short.bin"), std::vector<char>(bytes.begin(), bytes.begin() + 100));
  expect_error([&] { read_llmc_config(path("short.bin")); },
               {path("short.bin"), "truncated llm.c header"});
  expect_error([&] { load_llmc_model(path("missing.bin"), a); },
               {path("missing.bin"), "cannot open"});
  ModelConfig other = tiny_gpt2();
  other.n_layer = 3;
  Transformer b(other);
  expect_error([&] { load_llmc_model(good, b); }, {good, "model.n_layer: file has 2, model has 3"});
  expect_error([&] { save_llmc_model(path("x.bin"), a, 4); },
               {"unsupported llm.c model version 4"});
  Transformer llama(testing::tiny_llama());
  expect_error([&] { save_llmc_model(path("x.bin"), llama); }, {path("x.bin"), "model.arch"});
}

}  // namespace
}  // namespace loom
