// tests/train/fuzz_test.cpp — a deterministic mutation fuzzer for every parser of user input:
// the config (YAML text), token shards, document shards' indexes, chat JSONL lines and chat
// templates, native checkpoints (meta.yaml, the tensor files and
// their piece metadata), llm.c model files and Hugging Face directories (config.json and
// safetensors). Each case starts from a valid input, mutates it (bit flips, overwritten or
// inserted bytes, truncation, a duplicated line, a number replaced by an extreme one, a quoted
// string replaced by a value of another type), and runs
// the parser the way the trainer does. A parser may accept or refuse — refusing only as a user
// error in Loom's words (ConfigError or InputError, naming the file): a loom::Error with a source
// location or a library's exception (JSON, YAML, filesystem) fails the test, as does a crash, a
// hang or an allocation without bound. Every case is reproducible from its seed.
//
// CI runs LOOM_FUZZ_ITERATIONS (default 200) mutations per parser. A longer run, by hand:
//   LOOM_FUZZ_ITERATIONS=100000 LOOM_FUZZ_SEED=7 build/bin/train_tests --gtest_filter='Fuzz.*'
// (docs/checkpoints.md, "Fuzzing"). The counts of accepted and refused inputs are printed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/chat.h"
#include "data/documents.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "layers/transformer.h"
#include "tests/layers/tiny_models.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/hf_format.h"
#include "train/llmc_format.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : fallback;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// One mutation of `s`, chosen and placed by rng.
std::string mutate(std::string s, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  static const char* kExtremes[] = {"9223372036854775807",
                                    "-9223372036854775808",
                                    "-1",
                                    "0",
                                    "18446744073709551615",
                                    "1e308",
                                    "nan",
                                    "4294967296",
                                    "2147483648",
                                    "\"x\""};
  switch (rng() % 8) {
    case 0:  // flip a few bits
      for (int k = 1 + static_cast<int>(rng() % 8); k > 0 && !s.empty(); --k)
        s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8));
      break;
    case 1: {  // overwrite a run of bytes
      const size_t at = pick(s.size()), n = 1 + pick(16);
      for (size_t i = at; i < std::min(s.size(), at + n); ++i) s[i] = static_cast<char>(rng());
      break;
    }
    case 2:  // truncate
      s.resize(pick(s.size()));
      break;
    case 3: {  // insert bytes
      std::string ins(1 + pick(16), '\0');
      for (char& c : ins) c = static_cast<char>(rng());
      s.insert(pick(s.size() + 1), ins);
      break;
    }
    case 4: {  // duplicate a line
      std::vector<size_t> starts = {0};
      for (size_t i = 0; i < s.size(); ++i)
        if (s[i] == '\n') starts.push_back(i + 1);
      const size_t b = starts[pick(starts.size())];
      const size_t e = s.find('\n', b);
      const std::string line = s.substr(b, e == std::string::npos ? std::string::npos : e - b + 1);
      s.insert(b, line);
      break;
    }
    case 5: {  // a quoted string replaced by a value of another type (JSON and YAML)
      static const char* kOthers[] = {"null", "5", "-1.5", "[]", "{}", "true", "[\"a\", 1]"};
      std::vector<std::pair<size_t, size_t>> strings;
      for (size_t i = s.find('"'); i != std::string::npos;) {
        const size_t j = s.find('"', i + 1);
        if (j == std::string::npos) break;
        strings.emplace_back(i, j - i + 1);
        i = s.find('"', j + 1);
      }
      if (strings.empty()) break;
      const auto [at, n] = strings[pick(strings.size())];
      s.replace(at, n, kOthers[rng() % (sizeof(kOthers) / sizeof(kOthers[0]))]);
      break;
    }
    default: {  // a number replaced by an extreme one
      std::vector<std::pair<size_t, size_t>> nums;
      for (size_t i = 0; i < s.size();) {
        if (std::isdigit(static_cast<unsigned char>(s[i]))) {
          size_t j = i;
          while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
          nums.emplace_back(i, j - i);
          i = j;
        } else {
          ++i;
        }
      }
      if (nums.empty()) break;
      const auto [at, n] = nums[pick(nums.size())];
      s.replace(at, n, kExtremes[rng() % (sizeof(kExtremes) / sizeof(kExtremes[0]))]);
    }
  }
  return s;
}

// Mutates file `target` (a copy of `seed`'s bytes) `iterations` times, running `parse` on each;
// returns (accepted, refused).
std::pair<int64_t, int64_t> fuzz(const std::string& name, const std::string& target,
                                 const std::string& seed_bytes,
                                 const std::function<void()>& parse) {
  const int64_t iterations = env_int("LOOM_FUZZ_ITERATIONS", 200);
  const uint64_t seed = static_cast<uint64_t>(env_int("LOOM_FUZZ_SEED", 1));
  int64_t accepted = 0, refused = 0;
  for (int64_t i = 0; i < iterations; ++i) {
    std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(i));
    std::string bytes = mutate(seed_bytes, rng);
    if (rng() % 3 == 0) bytes = mutate(bytes, rng);  // sometimes two
    write_file(target, bytes);
    SCOPED_TRACE(name + " case " + std::to_string(i) + " (LOOM_FUZZ_SEED=" + std::to_string(seed) +
                 ")");
    try {
      parse();
      ++accepted;
    } catch (const ConfigError&) {
      ++refused;
    } catch (const InputError&) {
      ++refused;
    } catch (const Error& e) {  // a check meant for Loom's own bugs: the input got too far
      ++refused;
      ADD_FAILURE() << "refused with an internal error (a source location, not the file): "
                    << e.what();
    } catch (const std::exception& e) {  // a library's text reached the user
      ++refused;
      ADD_FAILURE() << "refused with a library exception: " << e.what();
    }
  }
  write_file(target, seed_bytes);
  std::printf("fuzz %s: %lld inputs, %lld accepted, %lld refused\n", name.c_str(),
              static_cast<long long>(accepted + refused), static_cast<long long>(accepted),
              static_cast<long long>(refused));
  return {accepted, refused};
}

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/loom_fuzz_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

using testing::tiny_gpt2;  // tests/layers/tiny_models.h

TEST(Fuzz, Config) {
  const std::string dir = fresh_dir("config");
  const std::string path = dir + "/c.yaml";
  const std::string seed =
      "model: {arch: gpt2, vocab_size: 64, n_layer: 2, n_head: 2, n_embd: 16, max_seq_len: 32}\n"
      "data:\n  train: x_*.bin\n  batch_size: 4\n  seq_len: 32\n"
      "optim:\n  lr: 1.0e-3\n  warmup_steps: 2\n  grad_accum: 2\n"
      "train:\n  steps: 10\n  sample_tokens: 16\n"
      "parallel:\n  dp: 2\n  tp: 1\n  zero_stage: 1\n  mics_partition_size: 0\n"
      "checkpoint:\n  every: 5\n  keep: 2\n";
  ASSERT_NO_THROW(parse_config_text(seed));
  fuzz("config", path, seed, [&] { parse_config_text(read_file(path)); });
}

TEST(Fuzz, TokenShard) {
  const std::string dir = fresh_dir("shard");
  const std::string path = dir + "/s.bin";
  std::vector<int32_t> tokens(300);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 37 % 50257);
  write_shard(path, std::span<const int32_t>(tokens));
  fuzz("shard", path, read_file(path), [&] {
    ShardReader r(path);
    int64_t sum = 0;
    for (int32_t t : r.tokens().to_vector()) sum += t;
    (void)sum;
  });
}

// A document shard's index (X.docs) read as PackedLoader reads it: every document's tokens and
// loss mask, and the vocabulary check.
TEST(Fuzz, DocumentIndex) {
  const std::string dir = fresh_dir("docs");
  const std::string path = dir + "/d.bin";
  std::vector<int32_t> tokens(300);
  std::vector<uint8_t> mask(300);
  std::vector<int64_t> offsets = {0};
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(i * 37 % 50257);
    if (i > 0 && i % 23 == 0) offsets.push_back(static_cast<int64_t>(i));
    mask[i] = offsets.back() == static_cast<int64_t>(i) ? 0 : (i % 3 == 0);
  }
  offsets.push_back(static_cast<int64_t>(tokens.size()));
  write_document_shard(path, tokens, mask, offsets);
  const std::string docs = docs_path_for(path);
  fuzz("document index", docs, read_file(docs), [&] {
    DocumentReader r(path);
    int64_t sum = 0;
    for (int64_t d = 0; d < r.num_docs(); ++d) {
      for (int32_t t : r.doc_tokens(d).to_vector()) sum += t;
      for (uint8_t m : r.doc_mask(d)) sum += m;
    }
    r.check_vocab(50257);
    (void)sum;
  });
}

// A chat JSONL line (both schemas) and a chat template, parsed and rendered as prepare_data does.
TEST(Fuzz, ChatLineAndTemplate) {
  const std::string dir = fresh_dir("chat");
  Tokenizer tok(std::string(LOOM_SOURCE_DIR) + "/data/gpt2-bpe");
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  const std::string line_path = dir + "/c.jsonl";
  const std::string line =
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": )"
      R"("Sort 3 1 2"}, {"role": "assistant", "content": "1 2 3"}]})";
  fuzz("chat line", line_path, line, [&] {
    const Conversation c = parse_conversation(read_file(line_path), "c.jsonl:1");
    ChatRenderer(default_chat_template(), tok).render(c, tokens, mask);
  });
  const std::string pr = R"({"prompt": "Add 2 and 3", "response": "5"})";
  fuzz("chat prompt/response", line_path, pr,
       [&] { parse_conversation(read_file(line_path), "c.jsonl:1"); });
  const std::string tmpl_path = dir + "/t.yaml";
  const std::string tmpl =
      "system: {prefix: \"System:\\n\", suffix: \"\\n\"}\nuser: {prefix: \"User:\\n\", suffix: "
      "\"\\n\"}\nassistant: {prefix: \"Assistant:\\n\", suffix: \"<|endoftext|>\"}\n";
  ASSERT_NO_THROW(parse_chat_template(tmpl, "t.yaml"));
  fuzz("chat template", tmpl_path, tmpl, [&] {
    const ChatTemplate t = parse_chat_template(read_file(tmpl_path), "t.yaml");
    ChatRenderer(t, tok).render(parse_conversation(line, "c.jsonl:1"), tokens, mask);
  });
}

// The checkpoint parsed as a resume reads it: meta.yaml, every file's header and pieces, then
// the run's pieces of each tensor; and whole, as convert reads it.
TEST(Fuzz, Checkpoint) {
  const std::string root = fresh_dir("checkpoint");
  Generator gen(3);
  CheckpointContents c;
  c.step = 4;
  c.state = {{"optim.step_count", "4"}, {"loader.position", "8"}};
  c.config_yaml = "train:\n  steps: 10\n";
  Placement half;
  half.global_shape = {6, 4};
  half.splits.push_back({0, "tp", {{0, 0, 1}, {1, 2, 1}, {2, 4, 1}}});
  const Tensor part = randn({3, 4}, gen);
  c.tensors = {whole_tensor("model.w", randn({5, 3}, gen)),
               {"model.q", part, piece_of(half, {3, 4})},
               {"optim.exp_avg.w", randn({15}, gen).narrow(0, 3, 9).contiguous(),
                piece_of(Placement{}, {5, 3}, 3, 12)}};
  const std::string dir = save_checkpoint(root, c, 0);
  auto parse = [&] {
    const CheckpointReader r(dir);
    Tensor w = Tensor::empty({5, 3}), q = Tensor::empty({3, 4}), m = Tensor::empty({9});
    r.read("model.w", whole_piece({5, 3}), w);
    r.read("model.q", piece_of(half, {3, 4}), q);
    r.read("optim.exp_avg.w", piece_of(Placement{}, {5, 3}, 3, 12), m);
    r.read_whole("model.w");  // the one stored whole
  };
  ASSERT_NO_THROW(parse());
  fuzz("checkpoint tensors", dir + "/tensors_00000.safetensors",
       read_file(dir + "/tensors_00000.safetensors"), parse);
  fuzz("checkpoint meta.yaml", dir + "/meta.yaml", read_file(dir + "/meta.yaml"), parse);
}

TEST(Fuzz, LlmcModelFile) {
  const std::string dir = fresh_dir("llmc");
  const std::string path = dir + "/m.bin";
  Transformer m(tiny_gpt2());
  Generator gen(5);
  m.init_weights(gen);
  save_llmc_model(path, m);
  fuzz("llm.c", path, read_file(path), [&] {
    read_llmc_config(path);
    Transformer into(tiny_gpt2());
    load_llmc_model(path, into);
  });
}

// config.json parsed alone (as convert does); the weights read for the run's own config (as
// init_from does, after comparing the configs).
TEST(Fuzz, HuggingFaceDirectory) {
  const std::string dir = fresh_dir("hf");
  Transformer m(tiny_gpt2());
  Generator gen(7);
  m.init_weights(gen);
  std::map<std::string, Tensor> w;
  for (const auto& [name, p] : m.named_parameters()) w[name] = p;
  write_hf_model(dir, tiny_gpt2(), w);
  fuzz("hf config.json", dir + "/config.json", read_file(dir + "/config.json"),
       [&] { read_hf_config(dir, tiny_gpt2().vocab_multiple); });
  fuzz("hf model.safetensors", dir + "/model.safetensors", read_file(dir + "/model.safetensors"),
       [&] { read_hf_weights(dir, tiny_gpt2()); });
  // A sharded export: its index (weight_map values of other types: issue 28, item 3).
  const std::string sharded = fresh_dir("hf_sharded");
  write_hf_model(sharded, tiny_gpt2(), w, DType::kF32, 4096);
  const std::string index = sharded + "/model.safetensors.index.json";
  ASSERT_TRUE(fs::exists(index));
  fuzz("hf index", index, read_file(index), [&] { read_hf_weights(sharded, tiny_gpt2()); });
}

}  // namespace
}  // namespace loom
