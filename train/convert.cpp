// train/convert.cpp — model conversion between Hugging Face, llm.c and native checkpoints, and
// checkpoint verification (see train/convert.h).
#include "train/convert.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <tuple>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/view.h"
#include "layers/transformer.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/hf_format.h"
#include "train/llmc_format.h"
#include "train/pieces.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

struct Location {
  std::string kind, path;  // "hf" | "llmc" | "loom"
};

Location parse_location(const std::string& s, const char* which) {
  const size_t colon = s.find(':');
  const std::string kind = colon == std::string::npos ? "" : s.substr(0, colon);
  LOOM_CHECK((kind == "hf" || kind == "llmc" || kind == "loom") && colon + 1 < s.size(), which,
             ": '", s, "' is not hf:DIR, llmc:FILE or loom:DIR");
  return {kind, s.substr(colon + 1)};
}

// A model as global tensors: Loom's parameter names (without "model."), plus what a native
// checkpoint carries beside them when the source is one.
struct Model {
  ModelConfig config;
  std::map<std::string, Tensor> weights;
  CheckpointContents rest;  // loom sources: optimizer state, step, run state, config
  bool from_checkpoint = false;
};

void report(const ConvertOptions& o, size_t done, size_t total, const char* what) {
  if (!o.progress || total == 0) return;
  if (done == total || done * 10 / total != (done - 1) * 10 / total)
    *o.progress << "convert: " << what << " " << done << "/" << total << " tensors\n";
}

// The model section of a checkpoint's config (the rest of the run's config does not matter
// here, and need not validate beside a model of another size).
ModelConfig model_config_of(const std::string& yaml, const std::string& dir) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    LOOM_FAIL(dir, ": the config in meta.yaml is not valid YAML: ", e.what());
  }
  LOOM_CHECK(root.IsMap() && root["model"], dir, ": meta.yaml's config has no model section");
  YAML::Node only;
  only["model"] = root["model"];
  only["data"]["seq_len"] =
      root["model"]["max_seq_len"] ? root["model"]["max_seq_len"] : YAML::Node(64);
  return parse_config_text(YAML::Dump(only)).model;
}

Model read_model(const Location& at, const ConvertOptions& o) {
  Model m;
  if (at.kind == "hf") {
    m.config = read_hf_config(at.path, o.vocab_multiple);
    m.weights = read_hf_weights(at.path, m.config, o.dtype);
  } else if (at.kind == "llmc") {
    m.config = read_llmc_config(at.path);
    Transformer model(m.config);
    load_llmc_model(at.path, model);
    for (auto& [name, p] : model.named_parameters()) m.weights[name] = ops::to_dtype(p, o.dtype);
  } else {
    const CheckpointReader r(at.path);
    m.from_checkpoint = true;
    m.config = model_config_of(r.config_yaml(), at.path);
    m.rest.step = r.step();
    m.rest.state = r.state();
    m.rest.config_yaml = r.config_yaml();
    const std::map<std::string, Shape> names = r.tensors();
    size_t done = 0;
    for (const auto& [name, shape] : names) {
      const Tensor t = r.read_whole(name);
      if (name.rfind("model.", 0) == 0)
        m.weights[name.substr(6)] = t;
      else
        m.rest.tensors.push_back(whole_tensor(name, t));
      report(o, ++done, names.size(), "read");
    }
  }
  // Every parameter of the config's model, with its shape (a checkpoint of another model, or a
  // file that misses one, is named here).
  const Transformer shape_of(m.config);
  for (const auto& [name, p] : shape_of.named_parameters()) {
    auto it = m.weights.find(name);
    LOOM_INPUT_CHECK(it != m.weights.end(), at.path, ": no tensor for parameter '", name, "'");
    LOOM_INPUT_CHECK(it->second.shape() == p.shape(), at.path, ": '", name, "' has shape ",
                     shape_str(it->second.shape()), " but the model needs ", shape_str(p.shape()));
  }
  return m;
}

std::string write_model(const Model& m, const Location& to, const ConvertOptions& o) {
  if (to.kind == "hf") {
    write_hf_model(to.path, m.config, m.weights, o.dtype, o.max_shard_bytes);
    return to.path;
  }
  if (to.kind == "llmc") {
    Transformer model(m.config);
    autograd::NoGradGuard no_grad;
    for (auto& [name, p] : model.named_parameters())
      ops::copy_(p, ops::to_dtype(m.weights.at(name), p.dtype()));
    save_llmc_model(to.path, model, o.llmc_version);
    return to.path;
  }
  CheckpointContents c = m.rest;
  if (!m.from_checkpoint) {  // a model alone: step 0, the model's config with defaults elsewhere
    Config cfg;
    cfg.model = m.config;
    cfg.data.seq_len = std::min(cfg.data.seq_len, m.config.max_seq_len);
    cfg.train.dtype = dtype_name(o.dtype);
    c.config_yaml = config_to_yaml(cfg);
  }
  for (const auto& [name, t] : m.weights) {
    const Tensor w = m.from_checkpoint ? t : ops::to_dtype(t, o.dtype);
    c.tensors.push_back(whole_tensor("model." + name, w));
  }
  return save_checkpoint(to.path, c, 0);
}

// Reads piece `piece` of global tensor `key` into dst, converting from the stored dtype.
void read_converted(const CheckpointReader& r, const std::string& key, const TensorPiece& piece,
                    Tensor dst) {
  const DType stored = r.dtype(key);
  if (stored == dst.dtype()) {
    r.read(key, piece, dst);
    return;
  }
  Tensor host = Tensor::empty(dst.shape(), stored);
  r.read(key, piece, host);
  ops::copy_(dst, ops::to_dtype(host, dst.dtype()).to(dst.device()));
}

// The run's part of a whole global tensor; `from` and `name` for the error when the file holds
// NaN or infinite values (a checkpoint's reader checks its own).
void copy_part(const Tensor& whole, Tensor dst, const std::string& from, const std::string& name) {
  const Tensor w = whole.detach().to(Device::cpu()).contiguous();
  LOOM_INPUT_CHECK(all_finite(w), from, ": '", name, "' holds NaN or infinite values");
  Tensor host = Tensor::empty(dst.shape(), w.dtype());
  const int64_t n =
      copy_overlap(whole_piece(w.shape()), w.raw_data(), piece_of(dst.placement(), dst.shape()),
                   host.raw_data(), dtype_size(w.dtype()));
  LOOM_CHECK(n == dst.numel(), "init_from: the run's part of a ", shape_str(w.shape()),
             " tensor is not inside it");
  ops::copy_(dst, ops::to_dtype(host, dst.dtype()).to(dst.device()));
}

}  // namespace

void load_model_weights(Transformer& model, const std::string& from, std::ostream& log) {
  if (fs::is_directory(from) && fs::exists(fs::path(from) / "config.json")) {
    // A Hugging Face directory: its config must be the run's model, then whole tensors → parts.
    const ModelConfig& m = model.config();
    const ModelConfig h = read_hf_config(from, m.vocab_multiple);
    const std::vector<std::tuple<const char*, std::string, std::string>> same = {
        {"model.arch", m.arch, h.arch},
        {"model.vocab_size", std::to_string(m.vocab_size), std::to_string(h.vocab_size)},
        {"model.n_layer", std::to_string(m.n_layer), std::to_string(h.n_layer)},
        {"model.n_head", std::to_string(m.n_head), std::to_string(h.n_head)},
        {"model.n_kv_head", std::to_string(m.kv_heads()), std::to_string(h.kv_heads())},
        {"model.n_embd", std::to_string(m.n_embd), std::to_string(h.n_embd)},
        {"model.ffn_hidden", std::to_string(m.ffn_hidden_size()),
         std::to_string(h.ffn_hidden_size())},
        {"model.tie_embeddings", std::to_string(m.tie_embeddings),
         std::to_string(h.tie_embeddings)}};
    for (const auto& [key, run, file] : same) {
      if (run != file) {
        throw ConfigError(std::string(key) + ": the run has " + run + ", the Hugging Face model " +
                          from + " has " + file);
      }
    }
    const std::map<std::string, Tensor> w = read_hf_weights(from, m, DType::kF32);
    for (const auto& [name, p] : model.named_parameters()) copy_part(w.at(name), p, from, name);
    log << "init_from: Hugging Face model " << from << "\n";
    return;
  }
  if (fs::is_directory(from) && !fs::exists(fs::path(from) / "meta.yaml")) {
    // A run's checkpoints folder (<out_dir>/checkpoints): its newest checkpoint.
    const std::string newest = latest_checkpoint(from);
    LOOM_INPUT_CHECK(!newest.empty(), "model.init_from: ", from,
                     " is neither a checkpoint (no meta.yaml), a Hugging Face directory (no "
                     "config.json) nor a folder of checkpoints");
    log << "init_from: the newest checkpoint of " << from << ": " << newest << "\n";
    load_model_weights(model, newest, log);
    return;
  }
  if (fs::is_directory(from)) {
    const CheckpointReader r(from);
    const auto params = model.named_parameters();
    for (const auto& [name, p] : params)
      read_converted(r, "model." + name, piece_of(p.placement(), p.shape()), p);
    log << "init_from: " << params.size() << " parameters from checkpoint " << from << "\n";
    return;
  }
  // An llm.c file holds whole tensors: read it into a single-device model, then take parts.
  Transformer whole(model.config());
  load_llmc_model(from, whole);
  for (const auto& [name, p] : model.named_parameters())
    copy_part(whole.parameter(name), p, from, name);
  log << "init_from: llm.c model file " << from << "\n";
}

std::string convert_model(const std::string& from, const std::string& to,
                          const ConvertOptions& options) {
  const Location src = parse_location(from, "--from"), dst = parse_location(to, "--to");
  const Model m = read_model(src, options);
  if (options.progress) *options.progress << "convert: writing " << to << "\n";
  return write_model(m, dst, options);
}

bool verify_checkpoint(const std::string& dir, std::ostream& out) {
  std::unique_ptr<CheckpointReader> r;
  try {
    r = std::make_unique<CheckpointReader>(dir);
  } catch (const Error& e) {
    out << "verify: " << e.what() << "\n";
    return false;
  }
  int64_t bytes = 0, bad = 0;
  const std::map<std::string, Shape> names = r->tensors();
  for (const auto& [name, shape] : names) {
    try {
      bytes += static_cast<int64_t>(r->read_whole(name).nbytes());
    } catch (const Error& e) {
      out << "verify: " << e.what() << "\n";
      ++bad;
    }
  }
  out << "verify: " << dir << ": step " << r->step() << ", " << names.size() << " tensors, "
      << bytes << " bytes read and checked" << (bad ? ", " + std::to_string(bad) + " damaged" : "")
      << "\n";
  return bad == 0;
}

}  // namespace loom
