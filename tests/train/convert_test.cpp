// tests/train/convert_test.cpp — conversions between Loom checkpoints, Hugging Face directories
// and llm.c files (train/convert.h, train/hf_format.h): round trips bit-identical (GPT-2 tied,
// Llama with grouped-query heads and an untied head; one file and sharded; f32, and bf16 for
// values bf16 holds exactly; llm.c versions 3 and 5), what transformers' names and Conv1D
// orientation look like in the file, a real client (the Python `safetensors` package, when it
// is installed) reading an export, errors that name the file and tensor, and verify on a
// damaged checkpoint.
#include "train/convert.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/ops/view.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "tests/layers/tiny_models.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/hf_format.h"
#include "train/safetensors.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/loom_convert_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// tests/layers/tiny_models.h: GPT-2 with vocab 11 padded to 12 (an export drops the padding
// row), n_embd 8, 2 heads; Llama with one kv head (GQA: q 8 rows, k and v 4 each), hidden 24,
// untied head.
using testing::tiny_gpt2;
using testing::tiny_llama;

// A model's initial weights as global tensors; with bf16, rounded to values bf16 holds.
std::map<std::string, Tensor> weights_of(const ModelConfig& c, bool bf16_exact = false) {
  Transformer m(c);
  Generator gen(17);
  m.init_weights(gen);
  std::map<std::string, Tensor> out;
  for (const auto& [name, p] : m.named_parameters()) {
    Tensor w = p.detach().clone();  // the vocabulary's padding rows are 0, as an import pads
    if (bf16_exact) w = ops::to_dtype(ops::to_dtype(w, DType::kBF16), DType::kF32);
    out[name] = w;
  }
  return out;
}

void expect_same(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(b.at(name).shape(), t.shape()) << name;
    EXPECT_EQ(b.at(name).to_vector(), t.to_vector()) << name;
  }
}

TEST(HfFormat, RoundTripsBitIdentical) {
  for (const ModelConfig& c : {tiny_gpt2(), tiny_llama()}) {
    for (const int64_t shard : {int64_t{1} << 30, int64_t{1000}}) {  // one file; several
      for (const DType dtype : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(c.arch + " shard " + std::to_string(shard) + " " + dtype_name(dtype));
        const auto w = weights_of(c, dtype == DType::kBF16);
        const std::string dir = fresh_dir("hf_rt");
        write_hf_model(dir, c, w, dtype, shard);
        EXPECT_EQ(fs::exists(dir + "/model.safetensors.index.json"), shard < 10000);
        const ModelConfig back = read_hf_config(dir, c.vocab_multiple);
        EXPECT_EQ(back.arch, c.arch);
        EXPECT_EQ(back.kv_heads(), c.kv_heads());
        EXPECT_EQ(back.ffn_hidden_size(), c.ffn_hidden_size());
        EXPECT_EQ(back.tie_embeddings, c.tie_embeddings);
        expect_same(w, read_hf_weights(dir, back));
      }
    }
  }
}

// Note [Hugging Face families]: each family's options survive an export and an import, the
// weights bit for bit, and the directory says the family transformers knows it by.
TEST(HfFormat, FamiliesRoundTrip) {
  struct Family {
    std::string type;
    ModelConfig c;
  };
  std::vector<Family> families;
  ModelConfig l3 = testing::tiny_llama();
  l3.explicit_head_dim = 6;
  l3.attention_bias = l3.mlp_bias = true;
  l3.rope_scaling = {.type = "llama3",
                     .factor = 8,
                     .low_freq_factor = 1,
                     .high_freq_factor = 4,
                     .original_max_seq_len = 8};
  families.push_back({"llama", l3});
  ModelConfig yarn = testing::tiny_llama();
  yarn.rope_scaling = {.type = "yarn",
                       .factor = 4,
                       .original_max_seq_len = 8,
                       .beta_fast = 16,
                       .attention_factor = 1.25,
                       .truncate = false};
  families.push_back({"llama", yarn});
  ModelConfig linear = testing::tiny_llama();
  linear.rope_scaling = {.type = "linear", .factor = 2};
  families.push_back({"llama", linear});
  ModelConfig qwen2 = testing::tiny_llama();
  qwen2.qkv_bias = true;
  families.push_back({"qwen2", qwen2});
  ModelConfig qwen3 = testing::tiny_llama();
  qwen3.qk_norm = true;
  qwen3.explicit_head_dim = 6;
  families.push_back({"qwen3", qwen3});
  ModelConfig mistral = testing::tiny_llama();
  mistral.explicit_head_dim = 8;
  mistral.sliding_window = 4096;
  families.push_back({"mistral", mistral});
  for (const Family& f : families) {
    const ModelConfig& c = f.c;
    SCOPED_TRACE(f.type + " " + c.rope_scaling.type);
    const auto w = weights_of(c);
    const std::string dir = fresh_dir("hf_family");
    write_hf_model(dir, c, w);
    std::ifstream in(dir + "/config.json");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("\"model_type\": \"" + f.type + "\""), std::string::npos) << text;
    const ModelConfig back = read_hf_config(dir, c.vocab_multiple);
    EXPECT_EQ(back.head_dim(), c.head_dim());
    EXPECT_EQ(back.has_qkv_bias(), c.has_qkv_bias());
    EXPECT_EQ(back.has_proj_bias(), c.has_proj_bias());
    EXPECT_EQ(back.has_mlp_bias(), c.has_mlp_bias());
    EXPECT_EQ(back.sliding_window, c.sliding_window);
    EXPECT_EQ(back.qk_norm, c.qk_norm);
    const RopeScaling &r = back.rope_scaling, &want = c.rope_scaling;
    EXPECT_EQ(r.type, want.type);
    if (want.type != "none") {
      EXPECT_EQ(r.factor, want.factor);
      EXPECT_EQ(r.original_max_seq_len, want.original_max_seq_len);
      EXPECT_EQ(r.low_freq_factor, want.low_freq_factor);
      EXPECT_EQ(r.high_freq_factor, want.high_freq_factor);
      EXPECT_EQ(r.beta_fast, want.beta_fast);
      EXPECT_EQ(r.attention_factor, want.attention_factor);
      EXPECT_EQ(r.truncate, want.truncate);
    }
    expect_same(w, read_hf_weights(dir, back));
  }
}

// config.json as transformers writes it (5.x: rope_parameters; 4.x: rope_scaling with "type"
// and rope_theta at the top), and what is refused, named.
TEST(HfFormat, ReadsTheFamiliesConfigsAndNamesWhatItRefuses) {
  const std::string dir = fresh_dir("hf_family_cfg");
  auto read = [&](const std::string& json_text) {
    std::ofstream(dir + "/config.json", std::ios::trunc) << json_text;
    return read_hf_config(dir);
  };
  auto refused = [&](const std::string& json_text) {
    try {
      read(json_text);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string llama =
      R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
         "max_position_embeddings": 2048, "rms_norm_eps": 1e-06)";
  ModelConfig c = read(R"({"model_type": "llama", "head_dim": 24, "attention_bias": true,
      "hidden_act": "silu",
      "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
      "original_max_position_embeddings": 64, "rope_theta": 500000.0, "rope_type": "llama3"}, )" +
                       llama + "}");
  EXPECT_EQ(c.head_dim(), 24);
  EXPECT_TRUE(c.has_qkv_bias() && c.has_proj_bias() && !c.has_mlp_bias());
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.original_max_seq_len, 64);
  c = read(R"({"model_type": "llama", "rope_theta": 20000.0,
      "rope_scaling": {"type": "linear", "factor": 2.0}, )" +
           llama + "}");
  EXPECT_EQ(c.rope_theta, 20000.0);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_EQ(c.rope_scaling.factor, 2.0);
  c = read(R"({"model_type": "qwen2", "use_sliding_window": false, "sliding_window": null,
      "layer_types": ["full_attention", "full_attention"], )" +
           llama + "}");
  EXPECT_TRUE(c.has_qkv_bias() && !c.has_proj_bias() && !c.has_mlp_bias());
  EXPECT_EQ(c.head_dim(), 16);
  c = read(R"({"model_type": "qwen3", "head_dim": 128, "attention_bias": false,
      "use_sliding_window": false, )" +
           llama + "}");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_TRUE(!c.has_qkv_bias() && !c.has_proj_bias() && !c.has_mlp_bias());
  c = read(R"({"model_type": "mistral", "head_dim": 32, "sliding_window": 4096, )" + llama + "}");
  EXPECT_EQ(c.head_dim(), 32);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.rope_scaling.type, "none");
  const std::pair<std::string, std::string> refusals[] = {
      {R"({"model_type": "gemma", )", "model_type 'gemma' is not supported"},
      {R"({"model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, )",
       "rope_type 'dynamic' is not supported"},
      {R"({"model_type": "llama", "rope_parameters": {"rope_type": "llama3", "factor": 8.0}, )",
       "missing 'low_freq_factor'"},
      {R"({"model_type": "qwen2", "use_sliding_window": true, )", "use_sliding_window"},
      {R"({"model_type": "llama", "partial_rotary_factor": 0.5, )", "partial_rotary_factor"},
      {R"({"model_type": "qwen2", "layer_types": ["sliding_attention", "full_attention"], )",
       "layer_types"},
      {R"({"model_type": "llama", "hidden_act": "gelu", )", "hidden_act 'gelu'"},
  };
  for (const auto& [head, words] : refusals) {
    const std::string msg = refused(head + llama + "}");
    EXPECT_NE(msg.find(words), std::string::npos) << msg;
    EXPECT_NE(msg.find(dir + "/config.json"), std::string::npos) << msg;
  }
}

// What another reader sees: transformers' names, Conv1D's (in, out) orientation, the real
// vocabulary only, q/k/v apart.
TEST(HfFormat, FileHoldsTransformersNamesAndOrientation) {
  const auto w = weights_of(tiny_gpt2());
  const std::string dir = fresh_dir("hf_names");
  write_hf_model(dir, tiny_gpt2(), w);
  const SafetensorsFile f = read_safetensors(dir + "/model.safetensors");
  std::map<std::string, Tensor> t(f.tensors.begin(), f.tensors.end());
  EXPECT_EQ(t.at("transformer.wte.weight").shape(), (Shape{11, 8}));
  EXPECT_EQ(t.count("lm_head.weight"), 0u);  // tied
  EXPECT_EQ(t.at("transformer.h.1.attn.c_attn.weight").shape(), (Shape{8, 24}));
  EXPECT_EQ(t.at("transformer.h.1.attn.c_attn.weight").to_vector(),
            w.at("blocks.1.attn.qkv.weight").transpose(0, 1).contiguous().to_vector());
  EXPECT_EQ(f.metadata.at("format"), "pt");

  const ModelConfig l = tiny_llama();
  const auto lw = weights_of(l);
  const std::string ldir = fresh_dir("hf_names_llama");
  write_hf_model(ldir, l, lw);
  const SafetensorsFile g = read_safetensors(ldir + "/model.safetensors");
  std::map<std::string, Tensor> u(g.tensors.begin(), g.tensors.end());
  EXPECT_EQ(u.at("model.layers.0.self_attn.q_proj.weight").shape(), (Shape{8, 8}));
  EXPECT_EQ(u.at("model.layers.0.self_attn.k_proj.weight").shape(), (Shape{4, 8}));
  EXPECT_EQ(u.at("model.layers.0.self_attn.k_proj.weight").to_vector(),
            lw.at("blocks.0.attn.qkv.weight").narrow(0, 8, 4).contiguous().to_vector());
  EXPECT_EQ(u.at("lm_head.weight").shape(), (Shape{11, 8}));
}

TEST(HfFormat, ErrorsNameTheFileAndTensor) {
  const ModelConfig c = tiny_gpt2();
  const std::string dir = fresh_dir("hf_errors");
  write_hf_model(dir, c, weights_of(c));
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ModelConfig wider = c;
  wider.n_embd = 16;
  EXPECT_NE(message([&] {
              read_hf_weights(dir, wider);
            }).find("model.safetensors: tensor 'transformer.wte.weight' has shape (11, 8)"),
            std::string::npos)
      << message([&] { read_hf_weights(dir, wider); });
  ModelConfig deeper = c;
  deeper.n_layer = 3;
  EXPECT_NE(message([&] {
              read_hf_weights(dir, deeper);
            }).find("no tensor 'transformer.h.2.ln_1.weight'"),
            std::string::npos);
  ModelConfig shallower = c;
  shallower.n_layer = 1;
  EXPECT_NE(message([&] {
              read_hf_weights(dir, shallower);
            }).find("tensor 'transformer.h.1.attn.c_attn.bias' has no place in a gpt2 model"),
            std::string::npos);
  std::ofstream(dir + "/config.json", std::ios::trunc) << "{\"model_type\": \"bert\"}";
  EXPECT_NE(message([&] { read_hf_config(dir); }).find("model_type 'bert' is not supported"),
            std::string::npos);
}

// A native checkpoint → Hugging Face → native, and → llm.c (both versions) → native, through
// the convert entry point; then verify finds a flipped byte.
TEST(Convert, CheckpointRoundTripsThroughHfAndLlmc) {
  const ModelConfig c = tiny_gpt2();
  Config cfg;
  cfg.model = c;
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16-exact" : "f32");
    const auto w = weights_of(cfg.model, bf16);
    CheckpointContents ck;
    ck.step = 7;
    ck.config_yaml = config_to_yaml(cfg);
    for (const auto& [name, t] : w) ck.tensors.push_back(whole_tensor("model." + name, t));
    const std::string root = fresh_dir(bf16 ? "cv_bf16" : "cv_f32");
    const std::string src = save_checkpoint(root + "/src", ck, 0);
    auto model_of = [](const std::string& dir) {
      std::map<std::string, Tensor> out;
      for (const CheckpointTensor& t : load_checkpoint(dir).tensors)
        out[t.name.substr(6)] = t.values;
      return out;
    };
    ConvertOptions o;
    o.dtype = bf16 ? DType::kBF16 : DType::kF32;
    o.vocab_multiple = c.vocab_multiple;
    convert_model("loom:" + src, "hf:" + root + "/hf", o);
    o.dtype = DType::kF32;
    const std::string back = convert_model("hf:" + root + "/hf", "loom:" + root + "/back", o);
    expect_same(w, model_of(back));
    o.llmc_version = bf16 ? 5 : 3;
    convert_model("loom:" + src, "llmc:" + root + "/m.bin", o);
    expect_same(w, model_of(convert_model("llmc:" + root + "/m.bin", "loom:" + root + "/l", o)));
  }
  // verify: a good checkpoint, then one byte flipped in its tensor file.
  const std::string root = fresh_dir("cv_verify");
  CheckpointContents ck;
  ck.step = 1;
  ck.tensors.push_back(whole_tensor("model.w", Tensor::ones({1000})));
  const std::string dir = save_checkpoint(root, ck, 0);
  std::ostringstream out;
  EXPECT_TRUE(verify_checkpoint(dir, out)) << out.str();
  {
    std::fstream f(dir + "/tensors_00000.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x7f');
  }
  std::ostringstream bad;
  EXPECT_FALSE(verify_checkpoint(dir, bad));
  EXPECT_NE(bad.str().find("tensor 'model.w' is corrupt"), std::string::npos) << bad.str();
}

// A Hugging Face export carries the tokenizer's files where convert knows them: from a Loom
// checkpoint whose run names data.tokenizer hf:DIR, and from a Hugging Face source; a run on
// GPT-2's files gets none.
TEST(Convert, HfExportsCarryTheTokenizerFiles) {
  const std::string root = fresh_dir("cv_tok");
  fs::create_directories(root + "/tok");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    std::ofstream(root + "/tok/" + f) << "{\"file\": \"" << f << "\"}";
  }
  Config cfg;
  cfg.model = tiny_gpt2();
  cfg.data.tokenizer = "hf:" + root + "/tok";
  CheckpointContents ck;
  ck.step = 3;
  ck.config_yaml = config_to_yaml(cfg);
  for (const auto& [name, t] : weights_of(cfg.model, false))
    ck.tensors.push_back(whole_tensor("model." + name, t));
  const std::string src = save_checkpoint(root + "/src", ck, 0);
  ConvertOptions o;
  o.vocab_multiple = cfg.model.vocab_multiple;
  const std::string hf = convert_model("loom:" + src, "hf:" + root + "/hf", o);
  const auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(read(hf + "/tokenizer.json"), "{\"file\": \"tokenizer.json\"}");
  EXPECT_EQ(read(hf + "/tokenizer_config.json"), "{\"file\": \"tokenizer_config.json\"}");
  EXPECT_FALSE(fs::exists(hf + "/tokenizer.model"));
  const std::string again = convert_model("hf:" + hf, "hf:" + root + "/hf2", o);
  EXPECT_EQ(read(again + "/tokenizer.json"), "{\"file\": \"tokenizer.json\"}");
  cfg.data.tokenizer = "gpt2";
  ck.config_yaml = config_to_yaml(cfg);
  const std::string plain = save_checkpoint(root + "/plain", ck, 0);
  EXPECT_FALSE(
      fs::exists(convert_model("loom:" + plain, "hf:" + root + "/hf3", o) + "/tokenizer.json"));
}

// The Python safetensors package (a reader Loom did not write) opens an export and finds the
// names, shapes and values. Skipped with the reason when python3 or the package is missing
// (tools/test.sh installs it with pip).
TEST(HfFormat, PythonSafetensorsReadsTheExport) {
  if (std::system("python3 -c 'import safetensors.numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with the safetensors and numpy packages is not installed";
  const ModelConfig c = tiny_llama();
  const auto w = weights_of(c);
  const std::string dir = fresh_dir("hf_python");
  write_hf_model(dir, c, w, DType::kF32, 1000);  // sharded, with the index
  const std::string out = dir + "/listing.txt";
  const std::string cmd =
      "python3 -c \"import json, sys\n"
      "from safetensors.numpy import load_file\n"
      "d = sys.argv[1]\n"
      "idx = json.load(open(d + '/model.safetensors.index.json'))\n"
      "rows = []\n"
      "for f in sorted(set(idx['weight_map'].values())):\n"
      "    for k, v in load_file(d + '/' + f).items():\n"
      "        rows.append('%s %s %.9e' % (k, 'x'.join(map(str, v.shape)), "
      "float(v.astype('f8').sum())))\n"
      "open(sys.argv[2], 'w').write('\\\\n'.join(sorted(rows)) + '\\\\n')\n\" " +
      dir + " " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::map<std::string, std::pair<std::string, double>> seen;
  std::ifstream in(out);
  std::string name, shape;
  double sum = 0;
  while (in >> name >> shape >> sum) seen[name] = {shape, sum};
  auto expect = [&](const std::string& hf, const Tensor& t) {
    ASSERT_TRUE(seen.count(hf)) << hf;
    std::string s;
    for (int64_t d : t.shape()) s += (s.empty() ? "" : "x") + std::to_string(d);
    EXPECT_EQ(seen[hf].first, s) << hf;
    double want = 0;
    for (double v : t.to_vector()) want += v;
    EXPECT_NEAR(seen[hf].second, want, 1e-6 * (1 + std::abs(want))) << hf;
  };
  EXPECT_EQ(seen.size(), 3u + 9u * 2u);  // embed, head, final norm; 9 per layer
  expect("model.embed_tokens.weight", w.at("wte.weight").narrow(0, 0, 11));
  expect("model.layers.1.self_attn.v_proj.weight",
         w.at("blocks.1.attn.qkv.weight").narrow(0, 12, 4));
  expect("model.layers.0.mlp.down_proj.weight", w.at("blocks.0.mlp.down.weight"));
  expect("model.norm.weight", w.at("norm_f.weight"));
}

}  // namespace
}  // namespace loom
