// train/checkpoint.cpp — see Note [Atomic checkpoints] in train/checkpoint.h.
#include "train/checkpoint.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "train/crc32c.h"
#include "train/safetensors.h"

namespace loom {
namespace fs = std::filesystem;

namespace {

constexpr const char* kMetaFile = "meta.yaml";
constexpr const char* kTensorFile = "tensors_00000.safetensors";

std::string shape_text(const Shape& s) {
  std::ostringstream out;
  for (size_t i = 0; i < s.size(); ++i) out << (i ? "," : "") << s[i];
  return out.str();
}

void write_meta(const std::string& path, const CheckpointContents& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "format_version" << YAML::Value << kCheckpointFormatVersion;
  out << YAML::Key << "step" << YAML::Value << c.step;
  out << YAML::Key << "state" << YAML::Value << YAML::BeginMap;
  for (const auto& [k, v] : c.state) out << YAML::Key << k << YAML::Value << YAML::DoubleQuoted << v;
  out << YAML::EndMap;
  out << YAML::Key << "config" << YAML::Value << YAML::Load(c.config_yaml.empty() ? "{}" : c.config_yaml);
  out << YAML::EndMap;
  std::ofstream f(path, std::ios::trunc);
  LOOM_CHECK(f, path, ": cannot open for writing");
  f << out.c_str() << "\n";
  f.flush();
  LOOM_CHECK(f, path, ": write failed (disk full?)");
}

// Step number of a directory named step_<digits>, or -1.
int64_t step_of(const fs::path& p) {
  const std::string n = p.filename().string();
  if (n.rfind("step_", 0) != 0 || n.size() <= 5) return -1;
  for (size_t i = 5; i < n.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(n[i]))) return -1;
  }
  return std::stoll(n.substr(5));
}

std::vector<fs::path> complete_checkpoints(const std::string& root) {
  std::vector<fs::path> out;
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.is_directory() && step_of(e.path()) >= 0 && fs::exists(e.path() / kMetaFile)) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) { return step_of(a) < step_of(b); });
  return out;
}

// Tensor shard and meta.yaml into `dir`, each fsync'ed, then the directory itself.
void write_checkpoint_files(const fs::path& dir, const CheckpointContents& c) {
  std::map<std::string, std::string> meta;
  for (const auto& [name, t] : c.tensors) {
    LOOM_CHECK(t.defined(), "checkpoint: tensor '", name, "' is undefined");
    const Tensor h = t.detach().to(Device::cpu()).contiguous();
    char crc[16];
    std::snprintf(crc, sizeof(crc), "%08x", crc32c(h.raw_data(), h.nbytes()));
    meta[name + ".crc32c"] = crc;
    meta[name + ".global_shape"] = shape_text(h.shape());
    meta[name + ".offsets"] = shape_text(Shape(h.shape().size(), 0));
  }
  write_safetensors((dir / kTensorFile).string(), c.tensors, meta);
  write_meta((dir / kMetaFile).string(), c);
  fsync_path((dir / kMetaFile).string());
  fsync_path(dir.string());
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string save_checkpoint(const std::string& root, const CheckpointContents& c, int64_t keep) {
  fs::create_directories(root);
  const fs::path final_dir = fs::path(root) / checkpoint_dir_name(c.step);
  const fs::path tmp = fs::path(root) / ("." + checkpoint_dir_name(c.step) + ".tmp" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    write_checkpoint_files(tmp, c);
  } catch (...) {
    fs::remove_all(tmp);  // the previous checkpoints are untouched
    throw;
  }

  // Move an existing checkpoint of the same step aside before renaming the new one in.
  const fs::path old = fs::path(root) / ("." + checkpoint_dir_name(c.step) + ".old");
  if (fs::exists(final_dir)) {
    fs::remove_all(old);
    fs::rename(final_dir, old);
  }
  fs::rename(tmp, final_dir);
  fsync_path(root);
  fs::remove_all(old);

  if (keep > 0) {
    std::vector<fs::path> all = complete_checkpoints(root);
    for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) {
      if (all[i] != final_dir) fs::remove_all(all[i]);
    }
  }
  return final_dir.string();
}

CheckpointContents load_checkpoint(const std::string& dir) {
  const std::string meta_path = (fs::path(dir) / kMetaFile).string();
  LOOM_CHECK(fs::exists(meta_path), dir, ": not a checkpoint (no ", kMetaFile, ")");
  YAML::Node meta;
  try {
    meta = YAML::LoadFile(meta_path);
  } catch (const YAML::Exception& e) {
    LOOM_FAIL(meta_path, ": corrupt: ", e.what());
  }
  LOOM_CHECK(meta["format_version"] && meta["step"], meta_path, ": missing format_version or step");
  const int version = meta["format_version"].as<int>();
  LOOM_CHECK(version == kCheckpointFormatVersion, meta_path, ": format version ", version,
             " is not supported (this Loom reads version ", kCheckpointFormatVersion, ")");
  CheckpointContents c;
  c.step = meta["step"].as<int64_t>();
  for (const auto& kv : meta["state"]) c.state[kv.first.as<std::string>()] = kv.second.as<std::string>();
  YAML::Emitter cfg;
  cfg << meta["config"];
  c.config_yaml = cfg.c_str();

  const std::string tensor_path = (fs::path(dir) / kTensorFile).string();
  SafetensorsFile f = read_safetensors(tensor_path);
  for (auto& [name, t] : f.tensors) {
    auto it = f.metadata.find(name + ".crc32c");
    LOOM_CHECK(it != f.metadata.end(), tensor_path, ": tensor '", name, "' has no checksum");
    char crc[16];
    std::snprintf(crc, sizeof(crc), "%08x", crc32c(t.raw_data(), t.nbytes()));
    LOOM_CHECK(it->second == crc, tensor_path, ": tensor '", name, "' is corrupt (checksum ", crc,
               ", expected ", it->second, ")");
  }
  c.tensors = std::move(f.tensors);
  return c;
}

std::string latest_checkpoint(const std::string& root) {
  std::vector<fs::path> all = complete_checkpoints(root);
  return all.empty() ? "" : all.back().string();
}

}  // namespace loom
