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
#include "parallel/comm/communicator.h"
#include "train/crc32c.h"
#include "train/safetensors.h"

namespace loom {
namespace fs = std::filesystem;

namespace {

constexpr const char* kMetaFile = "meta.yaml";
std::string tensor_file(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "tensors_%05d.safetensors", rank);
  return buf;
}

std::string shape_text(const Shape& s) {
  std::ostringstream out;
  for (size_t i = 0; i < s.size(); ++i) out << (i ? "," : "") << s[i];
  return out.str();
}

void write_meta(const std::string& path, const CheckpointContents& c, int num_shards) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "format_version" << YAML::Value << kCheckpointFormatVersion;
  out << YAML::Key << "step" << YAML::Value << c.step;
  out << YAML::Key << "num_shards" << YAML::Value << num_shards;
  out << YAML::Key << "state" << YAML::Value << YAML::BeginMap;
  for (const auto& [k, v] : c.state)
    out << YAML::Key << k << YAML::Value << YAML::DoubleQuoted << v;
  out << YAML::EndMap;
  out << YAML::Key << "config" << YAML::Value
      << YAML::Load(c.config_yaml.empty() ? "{}" : c.config_yaml);
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
    if (e.is_directory() && step_of(e.path()) >= 0 && fs::exists(e.path() / kMetaFile))
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end(),
            [](const fs::path& a, const fs::path& b) { return step_of(a) < step_of(b); });
  return out;
}

// This rank's tensor file into `dir`, fsync'ed.
void write_tensor_file(const fs::path& dir, const CheckpointContents& c, int rank) {
  std::map<std::string, std::string> meta;
  for (const auto& [name, t] : c.tensors) {
    LOOM_CHECK(t.defined(), "checkpoint: tensor '", name, "' is undefined");
    const Tensor h = t.detach().to(Device::cpu()).contiguous();
    char crc[16];
    std::snprintf(crc, sizeof(crc), "%08x", crc32c(h.raw_data(), h.nbytes()));
    meta[name + ".crc32c"] = crc;
    // Where the tensor sits in the global one (Note [Placement] in core/placement.h): a split
    // held as one run has its offset; a part in several runs (a fused qkv's rows: a chunk of
    // each of q, k, v) is recorded run by run in ".placement".
    const Placement pl = t.placement();
    Shape offsets(h.shape().size(), 0);
    bool runs = false;
    for (const PlacementSplit& s : pl.splits) {
      if (s.runs.size() == 1 && s.runs[0].local == 0)
        offsets[static_cast<size_t>(s.dim)] = s.runs[0].global;
      else
        runs = true;
    }
    meta[name + ".global_shape"] = shape_text(pl.global_shape);
    meta[name + ".offsets"] = shape_text(offsets);
    if (!pl.splits.empty()) meta[name + ".placement"] = placement_str(pl);
    if (runs) meta[name + ".offsets"] = "runs";
  }
  write_safetensors((dir / tensor_file(rank)).string(), c.tensors, meta);
}

// Whether every member succeeded (a max-reduction of the failure flags); true without a comm.
bool all_ok(bool ok, parallel::Communicator* comm) {
  if (!comm) return ok;
  Tensor flag = Tensor::full({1}, ok ? 0.0 : 1.0, DType::kF64);
  comm->all_reduce(flag, parallel::ReduceOp::kMax);
  return flag.item() == 0.0;
}

// Renames the complete temporary directory into place and prunes older checkpoints.
void publish(const std::string& root, const fs::path& tmp, const fs::path& final_dir,
             int64_t keep) {
  fsync_path((tmp / kMetaFile).string());
  fsync_path(tmp.string());
  // Move an existing checkpoint of the same step aside before renaming the new one in.
  const fs::path old = fs::path(root) / ("." + final_dir.filename().string() + ".old");
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
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string save_checkpoint(const std::string& root, const CheckpointContents& c, int64_t keep,
                            parallel::Communicator* comm) {
  const int rank = comm ? comm->rank() : 0;
  const fs::path final_dir = fs::path(root) / checkpoint_dir_name(c.step);
  const fs::path tmp = fs::path(root) / ("." + checkpoint_dir_name(c.step) + ".tmp");
  if (rank == 0) {
    fs::create_directories(root);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  if (comm) comm->barrier();
  std::string error;
  try {
    write_tensor_file(tmp, c, rank);
    if (rank == 0) write_meta((tmp / kMetaFile).string(), c, comm ? comm->size() : 1);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!all_ok(error.empty(), comm)) {
    if (rank == 0) fs::remove_all(tmp);  // the previous checkpoints are untouched
    if (comm) comm->barrier();
    LOOM_FAIL("checkpoint ", final_dir.string(),
              " not written: ", error.empty() ? "another rank failed" : error);
  }
  if (rank == 0) publish(root, tmp, final_dir, keep);
  if (comm) comm->barrier();
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
  for (const auto& kv : meta["state"])
    c.state[kv.first.as<std::string>()] = kv.second.as<std::string>();
  YAML::Emitter cfg;
  cfg << meta["config"];
  c.config_yaml = cfg.c_str();

  const int shards = meta["num_shards"] ? meta["num_shards"].as<int>() : 1;
  for (int r = 0; r < shards; ++r) {
    const std::string tensor_path = (fs::path(dir) / tensor_file(r)).string();
    LOOM_CHECK(fs::exists(tensor_path), dir, ": missing tensor file ", tensor_file(r), " (of ",
               shards, ")");
    SafetensorsFile f = read_safetensors(tensor_path);
    for (auto& [name, t] : f.tensors) {
      auto it = f.metadata.find(name + ".crc32c");
      LOOM_CHECK(it != f.metadata.end(), tensor_path, ": tensor '", name, "' has no checksum");
      char crc[16];
      std::snprintf(crc, sizeof(crc), "%08x", crc32c(t.raw_data(), t.nbytes()));
      LOOM_CHECK(it->second == crc, tensor_path, ": tensor '", name, "' is corrupt (checksum ", crc,
                 ", expected ", it->second, ")");
      c.tensors.emplace_back(name, t);
    }
  }
  return c;
}

std::string latest_checkpoint(const std::string& root) {
  std::vector<fs::path> all = complete_checkpoints(root);
  return all.empty() ? "" : all.back().string();
}

}  // namespace loom
