// train/hf_format.cpp — Hugging Face GPT-2 and Llama directories (Note [Hugging Face names] in
// train/hf_format.h).
#include "train/hf_format.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/view.h"
#include "layers/transformer.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"

namespace loom {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// One Loom tensor and the Hugging Face tensor(s) it is made of.
struct HfTensor {
  std::string loom;
  std::vector<std::string> hf;  // one, or q, k, v stacked along dim 0
  std::vector<int64_t> rows;    // rows of each hf tensor (with several)
  Shape shape;                  // Loom's
  bool transpose = false;       // GPT-2's Conv1D stores (in, out)
  bool vocab = false;           // Vp rows in Loom, vocab_size in the file
};

std::vector<HfTensor> hf_tensors(const ModelConfig& c, const std::string& gpt2_prefix) {
  const int64_t C = c.n_embd, Vp = c.padded_vocab(), F = c.ffn_hidden_size();
  std::vector<HfTensor> out;
  if (!c.is_llama()) {
    const std::string t = gpt2_prefix;
    out.push_back({"wte.weight", {t + "wte.weight"}, {}, {Vp, C}, false, true});
    out.push_back({"wpe.weight", {t + "wpe.weight"}, {}, {c.max_seq_len, C}});
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string h = t + "h." + std::to_string(i) + ".",
                        b = "blocks." + std::to_string(i) + ".";
      for (const char* n : {"ln_1", "ln_2"}) {
        out.push_back({b + n + ".weight", {h + n + ".weight"}, {}, {C}});
        out.push_back({b + n + ".bias", {h + n + ".bias"}, {}, {C}});
      }
      const std::vector<std::tuple<std::string, std::string, int64_t, int64_t>> linears = {
          {"attn.c_attn", "attn.qkv", 3 * C, C},
          {"attn.c_proj", "attn.proj", C, C},
          {"mlp.c_fc", "mlp.fc", F, C},
          {"mlp.c_proj", "mlp.proj", C, F}};
      for (const auto& [hf, lm, rows, cols] : linears) {
        out.push_back({b + lm + ".weight", {h + hf + ".weight"}, {}, {rows, cols}, true});
        out.push_back({b + lm + ".bias", {h + hf + ".bias"}, {}, {rows}});
      }
    }
    out.push_back({"ln_f.weight", {t + "ln_f.weight"}, {}, {C}});
    out.push_back({"ln_f.bias", {t + "ln_f.bias"}, {}, {C}});
  } else {
    const int64_t D = c.head_dim(), q = c.n_head * D, kv = c.kv_heads() * D;
    out.push_back({"wte.weight", {"model.embed_tokens.weight"}, {}, {Vp, C}, false, true});
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string h = "model.layers." + std::to_string(i) + ".",
                        b = "blocks." + std::to_string(i) + ".";
      out.push_back({b + "attn.qkv.weight",
                     {h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight",
                      h + "self_attn.v_proj.weight"},
                     {q, kv, kv},
                     {q + 2 * kv, C}});
      if (c.has_qkv_bias()) {
        out.push_back({b + "attn.qkv.bias",
                       {h + "self_attn.q_proj.bias", h + "self_attn.k_proj.bias",
                        h + "self_attn.v_proj.bias"},
                       {q, kv, kv},
                       {q + 2 * kv}});
      }
      out.push_back({b + "attn.proj.weight", {h + "self_attn.o_proj.weight"}, {}, {C, q}});
      if (c.has_proj_bias())
        out.push_back({b + "attn.proj.bias", {h + "self_attn.o_proj.bias"}, {}, {C}});
      out.push_back({b + "mlp.gate.weight", {h + "mlp.gate_proj.weight"}, {}, {F, C}});
      out.push_back({b + "mlp.up.weight", {h + "mlp.up_proj.weight"}, {}, {F, C}});
      out.push_back({b + "mlp.down.weight", {h + "mlp.down_proj.weight"}, {}, {C, F}});
      if (c.has_mlp_bias()) {
        out.push_back({b + "mlp.gate.bias", {h + "mlp.gate_proj.bias"}, {}, {F}});
        out.push_back({b + "mlp.up.bias", {h + "mlp.up_proj.bias"}, {}, {F}});
        out.push_back({b + "mlp.down.bias", {h + "mlp.down_proj.bias"}, {}, {C}});
      }
      if (c.qk_norm) {
        out.push_back({b + "attn.q_norm.weight", {h + "self_attn.q_norm.weight"}, {}, {D}});
        out.push_back({b + "attn.k_norm.weight", {h + "self_attn.k_norm.weight"}, {}, {D}});
      }
      out.push_back({b + "attn_norm.weight", {h + "input_layernorm.weight"}, {}, {C}});
      out.push_back({b + "mlp_norm.weight", {h + "post_attention_layernorm.weight"}, {}, {C}});
    }
    out.push_back({"norm_f.weight", {"model.norm.weight"}, {}, {C}});
  }
  if (!c.tie_embeddings)
    out.push_back({"lm_head.weight", {"lm_head.weight"}, {}, {Vp, C}, false, true});
  return out;
}

// The shape a Hugging Face tensor has in the file.
Shape file_shape(const HfTensor& t, size_t k, const ModelConfig& c) {
  if (t.hf.size() > 1) return t.shape.size() == 1 ? Shape{t.rows[k]} : Shape{t.rows[k], t.shape[1]};
  if (t.vocab) return {c.vocab_size, t.shape[1]};
  if (t.transpose) return {t.shape[1], t.shape[0]};
  return t.shape;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  LOOM_INPUT_CHECK(in, path, ": cannot open");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    LOOM_INPUT_FAIL(path, ": not valid JSON (at byte ", e.byte, ")");
  } catch (const json::exception&) {
    LOOM_INPUT_FAIL(path, ": not valid JSON");
  }
}

// A config.json value as T (bool, std::string, double or int64_t), checked here so that the
// error names the key and the file in Loom's words: an integer key refuses 2.5 (rather than
// reading 2) and a value beyond int64 (rather than wrapping).
template <typename T>
T value_as(const json& v, const std::string& key, const std::string& path) {
  if constexpr (std::is_same_v<T, bool>) {
    LOOM_INPUT_CHECK(v.is_boolean(), path, ": '", key, "' must be true or false, not ", v.dump());
    return v.get<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    LOOM_INPUT_CHECK(v.is_string(), path, ": '", key, "' must be a string, not ", v.dump());
    return v.get<std::string>();
  } else if constexpr (std::is_same_v<T, double>) {
    LOOM_INPUT_CHECK(v.is_number(), path, ": '", key, "' must be a number, not ", v.dump());
    return v.get<double>();
  } else {
    static_assert(std::is_same_v<T, int64_t>);
    const bool integral =
        v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                  v.get<double>() == std::trunc(v.get<double>()));
    LOOM_INPUT_CHECK(integral, path, ": '", key, "' must be an integer, not ", v.dump());
    const bool fits = v.is_number_unsigned()
                          ? v.get<uint64_t>() <= uint64_t{INT64_MAX}
                          : !v.is_number_float() || std::fabs(v.get<double>()) < 0x1p63;
    LOOM_INPUT_CHECK(fits, path, ": '", key, "' is ", v.dump(),
                     ", out of range (an integer of at most ", INT64_MAX, ")");
    return v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>();
  }
}

template <typename T>
T field(const json& j, const std::string& key, const std::string& path) {
  LOOM_INPUT_CHECK(j.is_object() && j.contains(key) && !j.at(key).is_null(), path, ": missing '",
                   key, "'");
  return value_as<T>(j.at(key), key, path);
}

template <typename T>
T field_or(const json& j, const std::string& key, T fallback, const std::string& path) {
  return j.is_object() && j.contains(key) && !j.at(key).is_null() ? field<T>(j, key, path)
                                                                  : fallback;
}

// Which file holds each tensor of the directory, and its entry there.
struct HfIndex {
  std::map<std::string, std::pair<std::string, SafetensorsEntry>> where;
};

HfIndex index_dir(const std::string& dir) {
  HfIndex x;
  std::vector<std::string> files;
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const json j = read_json(index.string());
    LOOM_INPUT_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                     index.string(), ": missing 'weight_map' (an object: tensor name → file)");
    std::set<std::string> names;
    for (const auto& [name, file] : j["weight_map"].items()) {
      LOOM_INPUT_CHECK(file.is_string() && !file.get<std::string>().empty(), index.string(),
                       ": weight_map['", name, "'] is ", file.dump(), ", not a file name");
      names.insert(file.get<std::string>());
    }
    for (const std::string& f : names) files.push_back((fs::path(dir) / f).string());
  } else {
    LOOM_INPUT_CHECK(fs::exists(single), dir,
                     ": no model.safetensors or model.safetensors.index.json");
    files.push_back(single.string());
  }
  for (const std::string& f : files) {
    for (const SafetensorsEntry& e : read_safetensors_index(f).entries) {
      LOOM_INPUT_CHECK(!x.where.count(e.name), dir, ": tensor '", e.name, "' is in two files");
      x.where[e.name] = {f, e};
    }
  }
  return x;
}

bool skipped_buffer(const std::string& name) {
  auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends("rotary_emb.inv_freq");
}

// RoPE's base and scaling: rope_theta at the top and rope_scaling (transformers 4), or both in
// rope_parameters (5); the types Loom computes (Note [RoPE scaling] in layers/rope_scaling.h),
// any other refused naming it.
void read_hf_rope(const json& j, const std::string& path, ModelConfig& c) {
  json rope = json::object();
  std::string key = "rope_parameters";
  // Both (Loom's export writes both for transformers 4 and 5): the same; rope_scaling first.
  for (const char* k : {"rope_scaling", "rope_parameters"}) {
    if (j.contains(k) && j[k].is_object() && !j[k].empty()) {
      rope = j[k];
      key = k;
      break;
    }
  }
  const std::string where = path + ": " + key;
  c.rope_theta =
      field_or<double>(j, "rope_theta", field_or<double>(rope, "rope_theta", 10000.0, where), path);
  std::string type = field_or<std::string>(rope, "rope_type", "", where);
  if (type.empty()) type = field_or<std::string>(rope, "type", "default", where);
  LOOM_INPUT_CHECK(
      field_or<double>(rope, "partial_rotary_factor",
                       field_or<double>(j, "partial_rotary_factor", 1.0, path), where) == 1.0,
      where, ": partial_rotary_factor other than 1 is not supported");
  if (type == "default") return;
  LOOM_INPUT_CHECK(type == "linear" || type == "llama3" || type == "yarn", where, ": rope_type '",
                   type, "' is not supported (default, linear, llama3 or yarn)");
  RopeScaling& r = c.rope_scaling;
  r.type = type;
  // The pre-training context: at the top first (Phi-3's place), as transformers reads it.
  const int64_t original = field_or<int64_t>(
      j, "original_max_position_embeddings",
      field_or<int64_t>(rope, "original_max_position_embeddings", 0, where), path);
  if (type == "linear") {
    r.factor = field<double>(rope, "factor", where);
  } else if (type == "llama3") {
    r.factor = field<double>(rope, "factor", where);
    r.low_freq_factor = field<double>(rope, "low_freq_factor", where);
    r.high_freq_factor = field<double>(rope, "high_freq_factor", where);
    r.original_max_seq_len = original > 0 ? original : c.max_seq_len;
  } else {
    r.factor = field_or<double>(rope, "factor", 0.0, where);
    r.original_max_seq_len = original;
    r.attention_factor = field_or<double>(rope, "attention_factor", 0.0, where);
    r.beta_fast = field_or<double>(rope, "beta_fast", 32.0, where);
    r.beta_slow = field_or<double>(rope, "beta_slow", 1.0, where);
    r.mscale = field_or<double>(rope, "mscale", 0.0, where);
    r.mscale_all_dim = field_or<double>(rope, "mscale_all_dim", 0.0, where);
    r.truncate = field_or<bool>(rope, "truncate", true, where);
  }
}

}  // namespace

ModelConfig read_hf_config(const std::string& dir, int64_t vocab_multiple) {
  const std::string path = (fs::path(dir) / "config.json").string();
  const json j = read_json(path);
  const std::string type = field<std::string>(j, "model_type", path);
  LOOM_INPUT_CHECK(
      type == "gpt2" || type == "llama" || type == "qwen2" || type == "qwen3" || type == "mistral",
      path, ": model_type '", type, "' is not supported (gpt2, llama, qwen2, qwen3 or mistral)");
  ModelConfig c;
  c.vocab_multiple = vocab_multiple;
  c.vocab_size = field<int64_t>(j, "vocab_size", path);
  if (type == "gpt2") {
    c.arch = "gpt2";
    c.n_layer = field<int64_t>(j, "n_layer", path);
    c.n_head = field<int64_t>(j, "n_head", path);
    c.n_embd = field<int64_t>(j, "n_embd", path);
    c.max_seq_len = field<int64_t>(j, "n_positions", path);
    c.ffn_hidden = field_or<int64_t>(j, "n_inner", 0, path);
    c.norm_eps = field_or<double>(j, "layer_norm_epsilon", 1e-5, path);
    c.tie_embeddings = field_or<bool>(j, "tie_word_embeddings", true, path);
    const std::string act = field_or<std::string>(j, "activation_function", "gelu_new", path);
    LOOM_INPUT_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", path,
                     ": activation_function '", act,
                     "' is not Loom's GPT-2 GELU (the tanh form: gelu_new)");
  } else {
    // Llama and the families that share its layout (Note [Hugging Face families] in
    // train/hf_format.h).
    c.arch = "llama";
    c.n_layer = field<int64_t>(j, "num_hidden_layers", path);
    c.n_head = field<int64_t>(j, "num_attention_heads", path);
    c.n_kv_head = field_or<int64_t>(j, "num_key_value_heads", c.n_head, path);
    c.n_embd = field<int64_t>(j, "hidden_size", path);
    c.ffn_hidden = field<int64_t>(j, "intermediate_size", path);
    c.max_seq_len = field<int64_t>(j, "max_position_embeddings", path);
    c.norm_eps = field_or<double>(j, "rms_norm_eps", 1e-6, path);
    c.tie_embeddings = field_or<bool>(j, "tie_word_embeddings", false, path);
    const int64_t head_dim = field_or<int64_t>(j, "head_dim", 0, path);
    LOOM_INPUT_CHECK(head_dim >= 0, path, ": 'head_dim' must be positive, not ", head_dim);
    if (head_dim > 0 && head_dim * c.n_head != c.n_embd) c.explicit_head_dim = head_dim;
    const std::string act = field_or<std::string>(j, "hidden_act", "silu", path);
    LOOM_INPUT_CHECK(act == "silu", path, ": hidden_act '", act,
                     "' is not supported (Loom's SwiGLU MLP is silu's)");
    if (type == "llama" || type == "qwen3")  // Qwen3's attention_bias: q, k, v and o, as Llama's
      c.attention_bias = field_or<bool>(j, "attention_bias", false, path);
    if (type == "llama") c.mlp_bias = field_or<bool>(j, "mlp_bias", false, path);
    if (type == "qwen3") c.qk_norm = true;  // q_norm and k_norm over each head
    if (type == "qwen2" || type == "qwen3") {
      c.qkv_bias = type == "qwen2";  // Qwen2's q, k and v have biases, its output none
      LOOM_INPUT_CHECK(!field_or<bool>(j, "use_sliding_window", false, path), path,
                       ": use_sliding_window true is not supported (Loom's attention has no "
                       "sliding window)");
    }
    if (type == "mistral") c.sliding_window = field_or<int64_t>(j, "sliding_window", 0, path);
    LOOM_INPUT_CHECK(c.sliding_window >= 0, path, ": 'sliding_window' must be positive, not ",
                     c.sliding_window);
    if (j.contains("layer_types") && j["layer_types"].is_array()) {
      for (const json& l : j["layer_types"])
        LOOM_INPUT_CHECK(l == "full_attention", path, ": layer_types holds ", l.dump(),
                         ": Loom's layers are all full attention");
    }
    read_hf_rope(j, path, c);
  }
  try {  // the model's own rules and size bounds (Note [Size bounds]), named as the file's
    validate(c);
  } catch (const ConfigError& e) {
    LOOM_INPUT_FAIL(path, ": ", e.what());
  }
  LOOM_INPUT_CHECK(c.vocab_size > 0 && c.n_layer > 0 && c.n_head > 0 &&
                       (c.explicit_head_dim > 0 || c.n_embd % c.n_head == 0),
                   path, ": impossible sizes (vocab ", c.vocab_size, ", layers ", c.n_layer,
                   ", heads ", c.n_head, ", n_embd ", c.n_embd, ")");
  return c;
}

std::map<std::string, Tensor> read_hf_weights(const std::string& dir, const ModelConfig& c,
                                              DType dtype) {
  const HfIndex index = index_dir(dir);
  const std::string prefix =
      !c.is_llama() && !index.where.count("transformer.wte.weight") ? "" : "transformer.";
  std::set<std::string> used;
  std::map<std::string, Tensor> out;
  autograd::NoGradGuard no_grad;
  for (const HfTensor& t : hf_tensors(c, prefix)) {
    std::vector<Tensor> parts;
    for (size_t k = 0; k < t.hf.size(); ++k) {
      auto it = index.where.find(t.hf[k]);
      LOOM_INPUT_CHECK(it != index.where.end(), dir, ": no tensor '", t.hf[k], "' (for Loom's ",
                       t.loom, ")");
      const auto& [file, e] = it->second;
      const Shape want = file_shape(t, k, c);
      LOOM_INPUT_CHECK(e.shape == want, file, ": tensor '", t.hf[k], "' has shape ",
                       shape_str(e.shape), " but the config needs ", shape_str(want));
      Tensor raw = Tensor::empty(e.shape, e.dtype);
      read_file_bytes(file, e.begin, e.end - e.begin, raw.raw_data());
      LOOM_INPUT_CHECK(all_finite(raw), file, ": tensor '", t.hf[k],
                       "' holds NaN or infinite values");
      parts.push_back(ops::to_dtype(raw, dtype));
      used.insert(t.hf[k]);
    }
    Tensor w = Tensor::zeros(t.shape, dtype);
    if (t.transpose) {
      ops::copy_(w, parts[0].transpose(0, 1));
    } else if (t.vocab) {
      Tensor rows = w.narrow(0, 0, c.vocab_size);
      ops::copy_(rows, parts[0]);
    } else {
      int64_t at = 0;
      for (const Tensor& p : parts) {
        Tensor dst = w.narrow(0, at, p.size(0));
        ops::copy_(dst, p);
        at += p.size(0);
      }
    }
    out[t.loom] = w;
  }
  for (const auto& [name, where] : index.where) {
    const bool tied_head = name == "lm_head.weight" && c.tie_embeddings;
    LOOM_INPUT_CHECK(used.count(name) || skipped_buffer(name) || tied_head, where.first,
                     ": tensor '", name, "' has no place in a ", c.arch, " model of this config");
  }
  return out;
}

void write_hf_model(const std::string& dir, const ModelConfig& c,
                    const std::map<std::string, Tensor>& weights, DType dtype,
                    int64_t max_shard_bytes) {
  fs::create_directories(dir);
  autograd::NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> tensors;  // in Hugging Face names
  for (const HfTensor& t : hf_tensors(c, "transformer.")) {
    auto it = weights.find(t.loom);
    LOOM_CHECK(it != weights.end(), "write_hf_model: no tensor '", t.loom, "'");
    const Tensor w = it->second.detach().to(Device::cpu());
    LOOM_CHECK(w.shape() == t.shape, "write_hf_model: '", t.loom, "' has shape ",
               shape_str(w.shape()), ", the config needs ", shape_str(t.shape));
    if (t.transpose) {
      tensors.emplace_back(t.hf[0], ops::to_dtype(w.transpose(0, 1).contiguous(), dtype));
    } else if (t.vocab) {
      tensors.emplace_back(t.hf[0],
                           ops::to_dtype(w.narrow(0, 0, c.vocab_size).contiguous(), dtype));
    } else {
      int64_t at = 0;
      for (size_t k = 0; k < t.hf.size(); ++k) {
        const int64_t rows = t.hf.size() > 1 ? t.rows[k] : t.shape[0];
        tensors.emplace_back(t.hf[k], ops::to_dtype(w.narrow(0, at, rows).contiguous(), dtype));
        at += rows;
      }
    }
  }
  // Shards of at most max_shard_bytes, in order.
  std::vector<std::vector<std::pair<std::string, Tensor>>> shards(1);
  int64_t bytes = 0, total = 0;
  for (auto& t : tensors) {
    const int64_t n = static_cast<int64_t>(t.second.nbytes());
    if (bytes > 0 && bytes + n > max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(std::move(t));
    bytes += n;
    total += n;
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (shards.size() == 1) {
    write_safetensors((fs::path(dir) / "model.safetensors").string(), shards[0], meta);
  } else {
    json map = json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      write_safetensors((fs::path(dir) / name).string(), shards[s], meta);
      for (const auto& [n, t] : shards[s]) map[n] = name;
    }
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
    const std::string path = (fs::path(dir) / "model.safetensors.index.json").string();
    std::ofstream out(path, std::ios::trunc);
    out << index.dump(2) << "\n";
    out.flush();
    LOOM_CHECK(out, path, ": write failed (disk full?)");
  }
  const char* torch_dtype = dtype == DType::kBF16  ? "bfloat16"
                            : dtype == DType::kF16 ? "float16"
                                                   : "float32";
  json cfg;
  if (!c.is_llama()) {
    cfg = {{"architectures", {"GPT2LMHeadModel"}},
           {"model_type", "gpt2"},
           {"vocab_size", c.vocab_size},
           {"n_positions", c.max_seq_len},
           {"n_ctx", c.max_seq_len},
           {"n_embd", c.n_embd},
           {"n_layer", c.n_layer},
           {"n_head", c.n_head},
           {"n_inner", c.ffn_hidden_size() == 4 * c.n_embd ? json(nullptr) : json(c.ffn_hidden)},
           {"layer_norm_epsilon", c.norm_eps},
           {"activation_function", "gelu_new"},
           {"resid_pdrop", 0.0},
           {"embd_pdrop", 0.0},
           {"attn_pdrop", 0.0},
           {"tie_word_embeddings", c.tie_embeddings},
           {"torch_dtype", torch_dtype}};
  } else {
    // Note [Hugging Face families]: q, k, v biases alone are Qwen2's; a sliding window is
    // Mistral's; anything else Llama's.
    const std::string type = c.qk_norm                         ? "qwen3"
                             : c.qkv_bias && !c.attention_bias ? "qwen2"
                             : c.sliding_window > 0            ? "mistral"
                                                               : "llama";
    LOOM_CONFIG_CHECK(!c.qk_norm || (!c.mlp_bias && !c.qkv_bias && c.sliding_window == 0),
                      "model.qk_norm: a model with q/k norms and MLP biases, q/k/v biases "
                      "alone or a sliding window has no Hugging Face family (Qwen3 has none of "
                      "them)");
    LOOM_CONFIG_CHECK(type != "qwen2" || !c.mlp_bias,
                      "model.mlp_bias: a model with q, k, v biases and MLP biases has no Hugging "
                      "Face family (Qwen2 has no MLP biases; Llama's attention_bias includes the "
                      "output projection's)");
    const std::string arch = type == "qwen3"     ? "Qwen3ForCausalLM"
                             : type == "qwen2"   ? "Qwen2ForCausalLM"
                             : type == "mistral" ? "MistralForCausalLM"
                                                 : "LlamaForCausalLM";
    const RopeScaling& r = c.rope_scaling;
    json rope = {{"rope_type", r.type == "none" ? "default" : r.type},
                 {"rope_theta", c.rope_theta}};
    if (r.type == "linear") rope["factor"] = r.factor;
    if (r.type == "llama3") {
      rope["factor"] = r.factor;
      rope["low_freq_factor"] = r.low_freq_factor;
      rope["high_freq_factor"] = r.high_freq_factor;
      rope["original_max_position_embeddings"] = r.original_max_seq_len;
    }
    if (r.type == "yarn") {
      rope["factor"] = r.factor > 0 ? json(r.factor) : json(nullptr);
      if (r.original_max_seq_len > 0)
        rope["original_max_position_embeddings"] = r.original_max_seq_len;
      if (r.attention_factor > 0) rope["attention_factor"] = r.attention_factor;
      rope["beta_fast"] = r.beta_fast;
      rope["beta_slow"] = r.beta_slow;
      if (r.mscale > 0) rope["mscale"] = r.mscale;
      if (r.mscale_all_dim > 0) rope["mscale_all_dim"] = r.mscale_all_dim;
      rope["truncate"] = r.truncate;
    }
    cfg = {{"architectures", {arch}},
           {"model_type", type},
           {"vocab_size", c.vocab_size},
           {"hidden_size", c.n_embd},
           {"intermediate_size", c.ffn_hidden_size()},
           {"num_hidden_layers", c.n_layer},
           {"num_attention_heads", c.n_head},
           {"num_key_value_heads", c.kv_heads()},
           {"head_dim", c.head_dim()},
           {"max_position_embeddings", c.max_seq_len},
           {"rms_norm_eps", c.norm_eps},
           {"rope_theta", c.rope_theta},  // transformers 4 reads it here, 5 in rope_parameters
           {"rope_parameters", rope},
           {"hidden_act", "silu"},
           {"tie_word_embeddings", c.tie_embeddings},
           {"torch_dtype", torch_dtype}};
    if (r.type != "none") cfg["rope_scaling"] = rope;  // transformers 4's key
    if (type == "llama" || type == "qwen3") cfg["attention_bias"] = c.attention_bias;
    if (type == "llama") cfg["mlp_bias"] = c.mlp_bias;
    if (type == "qwen2" || type == "qwen3") cfg["use_sliding_window"] = false;
    if (type == "mistral") cfg["sliding_window"] = c.sliding_window;
  }
  const std::string path = (fs::path(dir) / "config.json").string();
  {
    std::ofstream out(path + ".tmp", std::ios::trunc);
    LOOM_CHECK(out, path, ": cannot open for writing");
    out << cfg.dump(2) << "\n";
    out.flush();
    LOOM_CHECK(out, path, ": write failed (disk full?)");
  }
  fs::rename(path + ".tmp", path);
}

}  // namespace loom
