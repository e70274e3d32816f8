// tests/train/convert_safety_test.cpp — what `convert` and the model readers do with bad input
// and with destinations that already hold something (issue 28): Loom errors naming the file and
// the key or tensor, never a library's text or an abort (the `convert` executable run as a
// subprocess: rc 1 and one line); nothing overwritten unless --force, replaced whole with it
// (no stale shard left), never a path onto itself; NaN/inf weights and f16 overflow refused;
// safetensors files whose tensors overlap or leave bytes over refused; config.json integers
// checked; a run's checkpoints folder as a loom source.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "tests/layers/tiny_models.h"
#include "train/checkpoint.h"
#include "train/convert.h"
#include "train/hf_format.h"
#include "train/safetensors.h"

namespace loom {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using testing::tiny_gpt2;

std::string fresh_dir(const std::string& name) {
  // Unique per test process: ctest runs this file's tests in parallel processes.
  const std::string d =
      ::testing::TempDir() + "/loom_convert_safety_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::map<std::string, Tensor> weights_of(const ModelConfig& c, uint64_t seed = 17) {
  Transformer m(c);
  Generator gen(seed);
  m.init_weights(gen);
  std::map<std::string, Tensor> out;
  for (const auto& [name, p] : m.named_parameters()) out[name] = p.detach().clone();
  return out;
}

// A Hugging Face directory of tiny_gpt2 (sharded when shard_bytes is small).
std::string hf_model(const std::string& name, uint64_t seed = 17,
                     int64_t shard_bytes = int64_t{1} << 30) {
  const std::string d = fresh_dir(name) + "/hf";
  write_hf_model(d, tiny_gpt2(), weights_of(tiny_gpt2(), seed), DType::kF32, shard_bytes);
  return d;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// The message of what f throws (any exception), or "" when it throws nothing.
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool is_input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError&) {
    return true;
  } catch (...) {
    return false;
  }
  return false;
}

// A user's mistake reads as Loom's words: no JSON library text, no source location.
void expect_loom_words(const std::string& msg) {
  EXPECT_EQ(msg.find("json.exception"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("filesystem error"), std::string::npos) << msg;
  EXPECT_EQ(msg.find(".cpp:"), std::string::npos) << msg;
}

struct ToolResult {
  int rc = -1;
  std::string err;
};

// Runs the convert executable with `args`; its exit status and its stderr.
ToolResult run_convert(const std::string& args) {
  const std::string err =
      ::testing::TempDir() + "/loom_convert_safety_stderr_" + std::to_string(::getpid()) + ".txt";
  const std::string cmd =
      std::string(LOOM_BINARY_DIR) + "/convert " + args + " >/dev/null 2>" + err;
  const int status = std::system(cmd.c_str());
  ToolResult r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.err = slurp(err);
  return r;
}

// rc 1 and, after any progress lines ("convert: writing …"), one line of stderr in Loom's words
// containing `want`.
void expect_refused(const ToolResult& r, const std::string& want) {
  EXPECT_EQ(r.rc, 1) << r.err;
  std::istringstream in(r.err);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("convert: writing ", 0) != 0 && line.rfind("convert: read ", 0) != 0)
      lines.push_back(line);
  }
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind("convert: ", 0), 0u) << r.err;
  EXPECT_NE(lines[0].find(want), std::string::npos) << r.err;
  expect_loom_words(r.err);
}

// Item 3 / 8: a weight_map value that is not a file name, through the library (convert and
// init_from) and the executable.
TEST(ConvertSafety, IndexWithNonStringWeightMapIsAnInputError) {
  for (const char* bad : {"5", "null", "[\"a\"]"}) {
    SCOPED_TRACE(bad);
    const std::string d = hf_model("index", 17, 1000);
    const std::string index = d + "/model.safetensors.index.json";
    json j = json::parse(slurp(index));
    j["weight_map"]["transformer.wte.weight"] = json::parse(bad);
    write_text(index, j.dump());
    const std::string msg = message_of([&] { read_hf_weights(d, tiny_gpt2()); });
    EXPECT_NE(msg.find(index), std::string::npos) << msg;
    EXPECT_NE(msg.find("transformer.wte.weight"), std::string::npos) << msg;
    expect_loom_words(msg);
    EXPECT_TRUE(is_input_error([&] { read_hf_weights(d, tiny_gpt2()); }));
    Transformer model(tiny_gpt2());
    std::ostringstream log;
    const std::string init = message_of([&] { load_model_weights(model, d, log); });
    EXPECT_NE(init.find("transformer.wte.weight"), std::string::npos) << init;
    expect_loom_words(init);
    const std::string out = fs::path(d).parent_path().string() + "/out";
    expect_refused(run_convert("--from hf:" + d + " --to loom:" + out), index);
  }
}

// Item 3: destinations that cannot be created are refused with rc 1, never an abort.
TEST(ConvertSafety, UncreatableDestinationIsOneLineRc1) {
  const std::string d = hf_model("uncreatable");
  const std::string file = fs::path(d).parent_path().string() + "/plain_file";
  write_text(file, "not a directory");
  expect_refused(run_convert("--from hf:" + d + " --to hf:" + file + "/sub"), file);
  expect_refused(run_convert("--from hf:" + d + " --to loom:" + file), file);
  expect_refused(run_convert("--from hf:" + d + " --to loom:" + file + " --force"), file);
  expect_refused(run_convert("--from hf:" + d + " --to hf:" + file + " --force"), file);
  expect_refused(run_convert("--from hf:" + d + " --to hf:/proc/loom_convert_test"),
                 "/proc/loom_convert_test");
  expect_refused(run_convert("--from hf:" + d + " --to llmc:/proc/loom_convert_test.bin"),
                 "/proc/loom_convert_test.bin");
  expect_refused(run_convert("--from hf:" + d + " --to loom:/proc/loom_convert_test"),
                 "/proc/loom_convert_test");
  EXPECT_EQ(slurp(file), "not a directory");
  // A command-line mistake: a ConfigError, no source location.
  expect_refused(run_convert("--from bogus:" + d + " --to hf:" + d), "bogus:");
}

// Item 5: an existing destination is refused unless --force, and left as it was.
TEST(ConvertSafety, ExistingDestinationRefusedUnlessForce) {
  const std::string src = hf_model("existing_src");
  const std::string root = fresh_dir("existing");
  // hf:DIR holding another model.
  const std::string other = root + "/other";
  write_hf_model(other, tiny_gpt2(), weights_of(tiny_gpt2(), 99));
  const std::string before = slurp(other + "/model.safetensors");
  expect_refused(run_convert("--from hf:" + src + " --to hf:" + other), "--force");
  EXPECT_NE(run_convert("--from hf:" + src + " --to hf:" + other).err.find(other),
            std::string::npos);
  EXPECT_EQ(slurp(other + "/model.safetensors"), before);
  // llmc:FILE over a file.
  const std::string bin = root + "/m.bin";
  write_text(bin, "precious");
  expect_refused(run_convert("--from hf:" + src + " --to llmc:" + bin), "--force");
  EXPECT_EQ(slurp(bin), "precious");
  // loom:ROOT over an existing step_N.
  const std::string ck = root + "/ck";
  ASSERT_EQ(run_convert("--from hf:" + src + " --to loom:" + ck).rc, 0);
  const std::string meta = slurp(ck + "/step_00000000/meta.yaml");
  expect_refused(run_convert("--from hf:" + src + " --to loom:" + ck), "--force");
  EXPECT_EQ(slurp(ck + "/step_00000000/meta.yaml"), meta);
  // With --force each is replaced, and nothing temporary stays beside it.
  EXPECT_EQ(run_convert("--from hf:" + src + " --to hf:" + other + " --force").rc, 0);
  EXPECT_EQ(slurp(other + "/model.safetensors"), slurp(src + "/model.safetensors"));
  EXPECT_EQ(run_convert("--from hf:" + src + " --to llmc:" + bin + " --force").rc, 0);
  EXPECT_NE(slurp(bin), "precious");
  EXPECT_EQ(run_convert("--from hf:" + src + " --to loom:" + ck + " --force").rc, 0);
  EXPECT_TRUE(fs::exists(ck + "/step_00000000/meta.yaml"));
  for (const std::string& dir : {root, ck}) {
    for (const auto& e : fs::directory_iterator(dir))
      EXPECT_EQ(e.path().filename().string().find(".convert"), std::string::npos) << e.path();
  }
  // An empty directory is no model: written without --force.
  fs::create_directories(root + "/empty");
  EXPECT_EQ(run_convert("--from hf:" + src + " --to hf:" + root + "/empty").rc, 0);
  EXPECT_TRUE(fs::exists(root + "/empty/model.safetensors"));
}

// Item 5: a path onto itself is refused even with --force, and the source is untouched.
TEST(ConvertSafety, SelfConversionRefusedEvenWithForce) {
  const std::string d = hf_model("self");
  const std::string before = slurp(d + "/model.safetensors");
  expect_refused(run_convert("--from hf:" + d + " --to hf:" + d + " --force"), "itself");
  expect_refused(run_convert("--from hf:" + d + " --to hf:" + d + "/ --force"), "itself");
  const std::string parent = fs::path(d).parent_path().string();
  expect_refused(run_convert("--from hf:" + d + " --to hf:" + parent + " --force"), "source");
  EXPECT_EQ(slurp(d + "/model.safetensors"), before);
  const std::string bin = parent + "/m.bin";
  ASSERT_EQ(run_convert("--from hf:" + d + " --to llmc:" + bin).rc, 0);
  expect_refused(run_convert("--from llmc:" + bin + " --to llmc:" + bin + " --force"), "itself");
  ASSERT_EQ(run_convert("--from hf:" + d + " --to loom:" + parent + "/ck").rc, 0);
  expect_refused(run_convert("--from loom:" + parent + "/ck/step_00000000 --to loom:" + parent +
                             "/ck --force"),
                 "itself");
}

// Item 4: --force over an earlier sharded export replaces the directory whole: the old index
// and shards do not stay beside the new model.safetensors.
TEST(ConvertSafety, ForceOverShardedExportLeavesNoStaleFile) {
  const std::string src = hf_model("stale_src", 5);
  const std::string dst = hf_model("stale_dst", 99, 1000);
  ASSERT_TRUE(fs::exists(dst + "/model.safetensors.index.json"));
  ASSERT_EQ(run_convert("--from hf:" + src + " --to hf:" + dst + " --force").rc, 0);
  EXPECT_FALSE(fs::exists(dst + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dst + "/model-00001-of-00002.safetensors"));
  const auto got = read_hf_weights(dst, tiny_gpt2());
  const auto want = read_hf_weights(src, tiny_gpt2());
  for (const auto& [name, t] : want) EXPECT_EQ(got.at(name).to_vector(), t.to_vector()) << name;
}

// Item 6: NaN or infinite weights are refused on read, naming the tensor and the file.
TEST(ConvertSafety, NonFiniteWeightsRefusedNamingTheTensor) {
  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    auto w = weights_of(tiny_gpt2());
    w.at("blocks.1.mlp.fc.weight").data<float>()[3] = bad;
    const std::string root = fresh_dir("nan");
    write_hf_model(root + "/hf", tiny_gpt2(), w);
    ConvertOptions o;
    const std::string msg =
        message_of([&] { convert_model("hf:" + root + "/hf", "loom:" + root + "/ck", o); });
    EXPECT_NE(msg.find("transformer.h.1.mlp.c_fc.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("NaN or infinite"), std::string::npos) << msg;
    EXPECT_NE(msg.find(root + "/hf/model.safetensors"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(root + "/ck/step_00000000"));
    // A failed convert with --force leaves the destination as it was, and no temporary folder.
    write_hf_model(root + "/old", tiny_gpt2(), weights_of(tiny_gpt2(), 3), DType::kF32, 1000);
    const std::string index = slurp(root + "/old/model.safetensors.index.json");
    o.force = true;
    EXPECT_NE(message_of([&] { convert_model("hf:" + root + "/hf", "hf:" + root + "/old", o); }),
              "");
    EXPECT_EQ(slurp(root + "/old/model.safetensors.index.json"), index);
    for (const auto& e : fs::directory_iterator(root))
      EXPECT_EQ(e.path().filename().string().find(".convert"), std::string::npos) << e.path();
  }
}

// Item 7: --dtype f16 refuses values beyond f16's range, naming the tensor and the value.
TEST(ConvertSafety, F16OverflowRefusedNamingTheValue) {
  auto w = weights_of(tiny_gpt2());
  w.at("blocks.0.attn.proj.weight").data<float>()[2] = -1e5f;
  const std::string root = fresh_dir("f16");
  write_hf_model(root + "/hf", tiny_gpt2(), w);
  for (const std::string& to : {"hf:" + root + "/out", "loom:" + root + "/ck"}) {
    ConvertOptions o;
    o.dtype = DType::kF16;
    const std::string msg = message_of([&] { convert_model("hf:" + root + "/hf", to, o); });
    EXPECT_NE(msg.find("blocks.0.attn.proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("100000"), std::string::npos) << msg;
    EXPECT_NE(msg.find("65504"), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(root + "/out"));
  ConvertOptions o;
  o.dtype = DType::kBF16;  // bf16 holds it
  EXPECT_NO_THROW(convert_model("hf:" + root + "/hf", "hf:" + root + "/bf16", o));
}

// A safetensors file of two f32 tensors, "a" (2 values) and "b" (2 values), at the given data
// offsets, with `data_bytes` bytes of data.
std::string safetensors_with(const std::string& path, uint64_t a0, uint64_t a1, uint64_t b0,
                             uint64_t b1, size_t data_bytes) {
  const json h = {{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {a0, a1}}}},
                  {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {b0, b1}}}}};
  std::string text = h.dump();
  const uint64_t n = text.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  write_text(path, bytes + text + std::string(data_bytes, '\0'));
  return path;
}

// Item 15: overlapping tensors and bytes after the last one are refused, naming file and tensors.
TEST(ConvertSafety, SafetensorsOverlapAndTrailingBytesRefused) {
  const std::string d = fresh_dir("st");
  EXPECT_NO_THROW(read_safetensors_index(safetensors_with(d + "/ok.st", 0, 8, 8, 16, 16)));
  const std::string overlap = safetensors_with(d + "/overlap.st", 0, 8, 4, 12, 12);
  std::string msg = message_of([&] { read_safetensors_index(overlap); });
  EXPECT_NE(msg.find(overlap), std::string::npos) << msg;
  EXPECT_NE(msg.find("'a' and 'b' overlap"), std::string::npos) << msg;
  const std::string trailing = safetensors_with(d + "/trailing.st", 0, 8, 8, 16, 20);
  msg = message_of([&] { read_safetensors_index(trailing); });
  EXPECT_NE(msg.find(trailing), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 bytes after the last tensor 'b'"), std::string::npos) << msg;
  EXPECT_TRUE(is_input_error([&] { read_safetensors_index(trailing); }));
}

// Item 10: a malformed header names the tensor, in Loom's words.
TEST(ConvertSafety, SafetensorsHeaderErrorsNameTheTensor) {
  const std::string path = fresh_dir("st_header") + "/bad.st";
  for (const char* entry :
       {R"({"dtype": "F32", "shape": "x", "data_offsets": [0, 8]})",
        R"({"dtype": 3, "shape": [2], "data_offsets": [0, 8]})",
        R"({"dtype": "F32", "shape": [2], "data_offsets": [0]})",
        R"({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]})", R"([1, 2])"}) {
    SCOPED_TRACE(entry);
    const std::string text = std::string(R"({"my.tensor": )") + entry + "}";
    const uint64_t n = text.size();
    write_text(path,
               std::string(reinterpret_cast<const char*>(&n), 8) + text + std::string(8, '\0'));
    const std::string msg = message_of([&] { read_safetensors_index(path); });
    EXPECT_NE(msg.find("my.tensor"), std::string::npos) << msg;
    expect_loom_words(msg);
  }
}

// Item 15 / 10: config.json integers must be integers in range; other types named in Loom's
// words.
TEST(ConvertSafety, HfConfigValuesChecked) {
  const std::string d = hf_model("config");
  const json good = json::parse(slurp(d + "/config.json"));
  auto with = [&](const std::string& key, const json& v) {
    json j = good;
    j[key] = v;
    write_text(d + "/config.json", j.dump());
    return message_of([&] { read_hf_config(d); });
  };
  std::string msg = with("n_layer", 2.5);
  EXPECT_NE(msg.find("'n_layer' must be an integer, not 2.5"), std::string::npos) << msg;
  EXPECT_NE(msg.find(d + "/config.json"), std::string::npos) << msg;
  msg = with("vocab_size", 1e20);
  EXPECT_NE(msg.find("'vocab_size' is 1e+20, out of range"), std::string::npos) << msg;
  msg = with("vocab_size", json::parse("18446744073709551615"));
  EXPECT_NE(msg.find("18446744073709551615"), std::string::npos) << msg;
  EXPECT_EQ(with("n_layer", 2.0), "");  // an integral float is an integer
  msg = with("tie_word_embeddings", "yes");
  EXPECT_NE(msg.find("'tie_word_embeddings' must be true or false"), std::string::npos) << msg;
  expect_loom_words(msg);
  // Llama's rope_scaling with a rope_type that is not a string.
  const std::string l = fresh_dir("config_llama") + "/hf";
  write_hf_model(l, testing::tiny_llama(), weights_of(testing::tiny_llama()));
  json j = json::parse(slurp(l + "/config.json"));
  j["rope_scaling"] = {{"rope_type", 5}};
  write_text(l + "/config.json", j.dump());
  msg = message_of([&] { read_hf_config(l); });
  EXPECT_NE(msg.find("rope_type"), std::string::npos) << msg;
  expect_loom_words(msg);
  write_text(l + "/config.json", "{\"model_type\": ");
  msg = message_of([&] { read_hf_config(l); });
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
  expect_loom_words(msg);
}

// Item 15: a run's checkpoints folder is a loom source, as train.init_from takes it (its
// newest checkpoint).
TEST(ConvertSafety, CheckpointsFolderIsALoomSource) {
  const std::string src = hf_model("folder");
  const std::string root = fs::path(src).parent_path().string();
  ConvertOptions o;
  o.vocab_multiple = tiny_gpt2().vocab_multiple;
  convert_model("hf:" + src, "loom:" + root + "/run/checkpoints", o);
  const std::string out =
      convert_model("loom:" + root + "/run/checkpoints", "hf:" + root + "/back", o);
  EXPECT_EQ(out, root + "/back");
  EXPECT_EQ(slurp(root + "/back/model.safetensors"), slurp(src + "/model.safetensors"));
  const std::string msg =
      message_of([&] { convert_model("loom:" + root, "hf:" + root + "/x", o); });
  EXPECT_NE(msg.find("no meta.yaml"), std::string::npos) << msg;
}

// Item 10: a user's mistake in convert carries no source location and names the file: a Llama
// to llm.c (which holds GPT-2 only), a checkpoint whose config's model section is bad.
TEST(ConvertSafety, UserErrorsNameTheFileWithoutSourceLocation) {
  const std::string root = fresh_dir("user_errors");
  write_hf_model(root + "/llama", testing::tiny_llama(), weights_of(testing::tiny_llama()));
  expect_refused(run_convert("--from hf:" + root + "/llama --to llmc:" + root + "/m.bin"),
                 root + "/m.bin: llm.c files hold tied-head GPT-2 models only");
  EXPECT_FALSE(fs::exists(root + "/m.bin"));
  CheckpointContents ck;
  ck.config_yaml = "model: {arch: gpt2, n_layer: -3}\n";
  ck.tensors.push_back(whole_tensor("model.w", Tensor::ones({4})));
  const std::string dir = save_checkpoint(root + "/ck", ck, 0);
  const ToolResult r = run_convert("--from loom:" + dir + " --to hf:" + root + "/hf");
  expect_refused(r, dir + "/meta.yaml");
  EXPECT_NE(r.err.find("n_layer"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace loom
