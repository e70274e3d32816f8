// train/convert.cpp — model conversion between Hugging Face, llm.c and native checkpoints, and
// checkpoint verification (see train/convert.h).
#include "train/convert.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/view.h"
#include "core/tensor_piece.h"
#include "layers/transformer.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/hf_format.h"
#include "train/llmc_format.h"
#include "train/safetensors.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

struct Location {
  std::string kind, path;  // "hf" | "llmc" | "loom"
};

Location parse_location(const std::string& s, const char* which) {
  const size_t colon = s.find(':');
  const std::string kind = colon == std::string::npos ? "" : s.substr(0, colon);
  LOOM_CONFIG_CHECK((kind == "hf" || kind == "llmc" || kind == "loom") && colon + 1 < s.size(),
                    which, ": '", s, "' is not hf:DIR, llmc:FILE or loom:DIR");
  return {kind, s.substr(colon + 1)};
}

// A path made absolute and normal, without a trailing separator ("out/" is "out").
fs::path normal_path(const std::string& p) {
  fs::path a = fs::absolute(fs::path(p)).lexically_normal();
  if (!a.has_filename() && a.has_parent_path() && a != a.root_path()) a = a.parent_path();
  return a;
}

// Whether `inner` is `outer` or inside it (symbolic links resolved where the paths exist).
bool within(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const fs::path i = fs::weakly_canonical(inner, ec), o = fs::weakly_canonical(outer, ec);
  auto a = i.begin(), b = o.begin();
  for (; b != o.end() && !b->empty(); ++a, ++b) {
    if (a == i.end() || *a != *b) return false;
  }
  return true;
}

// Note [Convert destinations]: convert changes nothing it was given until the new model is
// complete. A destination (hf:DIR, llmc:FILE, the step_N folder of loom:ROOT) is written into a
// temporary folder beside it — same parent, a unique hidden name (.NAME.convert-XXXXXX) — and
// renamed into place whole. One that holds anything (a file, a folder with entries) is refused
// unless --force; with --force the old one is renamed into that temporary folder, the new one
// renamed into place, and the temporary folder removed, so no file of the old model (an earlier
// export's shards and index) stays beside the new one. A destination that is the source, or
// holds it, is refused even with --force (the source would be replaced while it is read). A
// failed or killed convert leaves the destination as it was (at most a hidden temporary folder
// beside it).
class StagedOutput {
 public:
  // `directory`: the destination is a folder (hf, loom) rather than a file (llmc).
  StagedOutput(const std::string& target, bool directory, bool force, const std::string& source)
      : target_(normal_path(target)), directory_(directory) {
    const fs::path parent = target_.parent_path();
    LOOM_CONFIG_CHECK(target_.has_filename() && !parent.empty(), target,
                      ": not a destination convert can write");
    LOOM_CONFIG_CHECK(
        !within(source, target_), target,
        within(target_, source) ? " is the source itself" : " holds the source " + source,
        ": convert does not write a model onto itself, even with --force (the "
        "source would be replaced while it is read); write elsewhere, then rename");
    std::error_code ec;
    const fs::file_status st = fs::status(target_, ec);
    if (fs::exists(st)) {
      LOOM_INPUT_CHECK(fs::is_directory(st) == directory, target,
                       directory ? " is a file, not a directory" : " is a directory, not a file",
                       ": convert does not replace one with the other");
      const bool empty = fs::is_directory(st) && fs::is_empty(target_, ec) && !ec;
      LOOM_INPUT_CHECK(empty || force, target,
                       " already exists and is not empty: convert overwrites nothing unless asked; "
                       "pass --force to replace it");
    }
    const fs::file_status ps = fs::status(parent, ec);
    LOOM_INPUT_CHECK(!fs::exists(ps) || fs::is_directory(ps), target,
                     ": cannot create it: ", parent.string(), " is not a directory");
    fs::create_directories(parent, ec);
    LOOM_INPUT_CHECK(!ec, target, ": cannot create ", parent.string(), ": ", ec.message());
    std::string pattern =
        (parent / ("." + target_.filename().string() + ".convert-XXXXXX")).string();
    errno = 0;
    LOOM_INPUT_CHECK(::mkdtemp(pattern.data()) != nullptr, target,
                     ": cannot create a temporary folder in ", parent.string(), ": ",
                     std::strerror(errno));
    staging_ = pattern;
  }
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;
  ~StagedOutput() {
    std::error_code ec;
    if (!staging_.empty()) fs::remove_all(staging_, ec);
  }

  // The temporary folder to write in.
  const fs::path& folder() const { return staging_; }
  // Where the new destination is written: the temporary folder's entry of the target's name.
  fs::path path() const { return staging_ / target_.filename(); }

  // Renames the written destination into place (replacing an old one whole), removes the
  // temporary folder, and syncs the parent.
  void commit() {
    std::error_code ec;
    LOOM_CHECK(fs::exists(path()), target_.string(), ": nothing was written");
    const fs::path old = staging_ / ".old";
    const bool replace = directory_ && fs::exists(target_);
    if (replace) {
      fs::rename(target_, old, ec);
      LOOM_INPUT_CHECK(!ec, target_.string(), ": cannot move the old one aside: ", ec.message());
    }
    fs::rename(path(), target_, ec);  // a file replaces an old file atomically
    if (ec) {
      std::error_code back;
      if (replace) fs::rename(old, target_, back);
      LOOM_INPUT_FAIL(target_.string(), ": cannot rename the new one into place: ", ec.message());
    }
    fs::remove_all(staging_, ec);
    staging_.clear();
    fsync_path(target_.parent_path().string());
  }

 private:
  fs::path target_, staging_;
  bool directory_;
};

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
  const std::string meta = (fs::path(dir) / "meta.yaml").string();
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    LOOM_INPUT_FAIL(meta, ": the run's config is not valid YAML (line ", e.mark.line + 1, ")");
  }
  LOOM_INPUT_CHECK(root.IsMap() && root["model"] && root["model"].IsMap(), meta,
                   ": the run's config has no model section");
  YAML::Node only;
  only["model"] = root["model"];
  only["data"]["seq_len"] =
      root["model"]["max_seq_len"] ? root["model"]["max_seq_len"] : YAML::Node(64);
  try {
    return parse_config_text(YAML::Dump(only)).model;
  } catch (const ConfigError& e) {
    LOOM_INPUT_FAIL(meta, ": ", e.what());
  }
}

// The model at `at` (`r`: its checkpoint's reader, for a loom source), its weights in their
// stored dtype (hf: in o.dtype, f32 when that is f16, so that cast_weights sees the range).
Model read_model(const Location& at, const CheckpointReader* ckpt, const ConvertOptions& o) {
  Model m;
  if (at.kind == "hf") {
    m.config = read_hf_config(at.path, o.vocab_multiple);
    m.weights = read_hf_weights(at.path, m.config, o.dtype == DType::kF16 ? DType::kF32 : o.dtype);
  } else if (at.kind == "llmc") {
    m.config = read_llmc_config(at.path);
    Transformer model(m.config);
    load_llmc_model(at.path, model);
    for (auto& [name, p] : model.named_parameters()) {
      const Tensor w = p.detach().contiguous();
      LOOM_INPUT_CHECK(all_finite(w), at.path, ": '", name, "' holds NaN or infinite values");
      m.weights[name] = w;
    }
  } else {
    const CheckpointReader& r = *ckpt;
    m.from_checkpoint = true;
    m.config = model_config_of(r.config_yaml(), r.dir());
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

// The largest value a floating dtype holds (f16: 65504); 0 for others.
double dtype_max(DType t) {
  switch (t) {
    case DType::kF16:
      return 65504.0;
    case DType::kBF16:
      return 3.3895313892515355e38;
    case DType::kF32:
      return std::numeric_limits<float>::max();
    default:
      return std::numeric_limits<double>::max();
  }
}

// Every weight in `dtype`, refusing a value the dtype cannot hold (it would become inf: f16's
// largest is 65504), naming the tensor and its largest magnitude. The sources are finite (each
// reader refuses NaN and inf), so a value that is not finite after the cast overflowed.
void cast_weights(Model& m, DType dtype, const std::string& from) {
  for (auto& [name, t] : m.weights) {
    if (t.dtype() == dtype) continue;
    Tensor out = ops::to_dtype(t, dtype).contiguous();
    if (!all_finite(out)) {
      double largest = 0;
      for (double v : t.to_vector()) largest = std::max(largest, std::fabs(v));
      LOOM_INPUT_FAIL(from, ": '", name, "' does not fit in ", dtype_name(dtype),
                      ": its largest magnitude is ", largest, ", ", dtype_name(dtype),
                      "'s largest value is ", dtype_max(dtype),
                      " (write f32 or bf16, or scale the model)");
    }
    t = out;
  }
}

// Writes the model as `kind` at `path` (a folder for hf, a file for llmc; for loom, `path` is the
// root the step_N folder is written in).
void write_model(const Model& m, const std::string& kind, const fs::path& path,
                 const ConvertOptions& o) {
  if (kind == "hf") {
    write_hf_model(path.string(), m.config, m.weights, o.dtype, o.max_shard_bytes);
    return;
  }
  if (kind == "llmc") {
    Transformer model(m.config);
    autograd::NoGradGuard no_grad;
    for (auto& [name, p] : model.named_parameters())
      ops::copy_(p, ops::to_dtype(m.weights.at(name), p.dtype()));
    save_llmc_model(path.string(), model, o.llmc_version);
    return;
  }
  CheckpointContents c = m.rest;
  if (!m.from_checkpoint) {  // a model alone: step 0, the model's config with defaults elsewhere
    Config cfg;
    cfg.model = m.config;
    cfg.data.seq_len = std::min(cfg.data.seq_len, m.config.max_seq_len);
    cfg.train.dtype = dtype_name(o.dtype);
    c.config_yaml = config_to_yaml(cfg);
  }
  for (const auto& [name, t] : m.weights) c.tensors.push_back(whole_tensor("model." + name, t));
  save_checkpoint(path.string(), c, 0);
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
    const std::string newest = checkpoint_in(from);
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

// A Hugging Face destination gets the tokenizer's files where convert knows them: a Hugging
// Face source's own, or, from a Loom checkpoint, those beside its run's data.tokenizer (hf:PATH).
std::vector<fs::path> tokenizer_files(const Location& src, const Model& m) {
  fs::path dir;
  if (src.kind == "hf") {
    dir = src.path;
  } else if (m.from_checkpoint && !m.rest.config_yaml.empty()) {
    // Only the one key: the run's config was checked when it ran.
    std::string spec;
    try {
      const YAML::Node t = YAML::Load(m.rest.config_yaml)["data"]["tokenizer"];
      if (t && t.IsScalar()) spec = t.as<std::string>();
    } catch (const YAML::Exception&) {  // not the key's business: read_model read the rest
    }
    if (spec.starts_with("hf:")) {
      const fs::path p = spec.substr(3);
      std::error_code ec;
      dir = fs::is_directory(p, ec) ? p : p.parent_path();
    }
  }
  std::vector<fs::path> out;
  if (dir.empty()) return out;
  for (const char* name :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"}) {
    std::error_code ec;
    if (fs::is_regular_file(dir / name, ec)) out.push_back(dir / name);
  }
  return out;
}

std::string convert_model(const std::string& from, const std::string& to,
                          const ConvertOptions& options) {
  Location src = parse_location(from, "--from");
  const Location dst = parse_location(to, "--to");
  std::unique_ptr<CheckpointReader> ckpt;
  if (src.kind == "loom") {  // a checkpoint, or a run's checkpoints folder (its newest)
    const std::string dir = checkpoint_in(src.path);
    LOOM_INPUT_CHECK(!dir.empty(), src.path,
                     ": not a checkpoint (no meta.yaml) nor a folder of checkpoints");
    if (dir != src.path && options.progress)
      *options.progress << "convert: the newest checkpoint of " << src.path << ": " << dir << "\n";
    src.path = dir;
    ckpt = std::make_unique<CheckpointReader>(dir);
  }
  // The destination is checked before anything is read (Note [Convert destinations]).
  const std::string target =
      dst.kind == "loom"
          ? (fs::path(dst.path) / checkpoint_dir_name(ckpt ? ckpt->step() : 0)).string()
          : dst.path;
  StagedOutput out(target, dst.kind != "llmc", options.force, src.path);
  Model m = read_model(src, ckpt.get(), options);
  if (dst.kind == "hf" || (dst.kind == "loom" && !m.from_checkpoint))
    cast_weights(m, options.dtype, from);
  if (dst.kind == "llmc") check_llmc_writable(m.config, dst.path);
  if (options.progress) *options.progress << "convert: writing " << to << "\n";
  write_model(m, dst.kind, dst.kind == "loom" ? out.folder() : out.path(), options);
  if (dst.kind == "hf") {
    for (const fs::path& f : tokenizer_files(src, m)) {
      std::error_code ec;
      fs::copy_file(f, fs::path(out.path()) / f.filename(), ec);
      LOOM_INPUT_CHECK(!ec, f.string(), ": cannot copy the tokenizer file into ", to, ": ",
                       ec.message());
    }
  }
  out.commit();
  return target;
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
