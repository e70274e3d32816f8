// train/checkpoint.cpp — writing pieces with their geometry and block checksums, publishing a
// checkpoint atomically (Note [Atomic checkpoints] in train/checkpoint.h), and reading any piece
// back from the stored ones (CheckpointReader).
#include "train/checkpoint.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/ops/view.h"
#include "parallel/comm/communicator.h"
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

// Complete checkpoints oldest first; incomplete step folders into `incomplete`.
std::vector<fs::path> complete_checkpoints(const std::string& root,
                                           std::vector<fs::path>* incomplete = nullptr) {
  std::vector<fs::path> out;
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory() || step_of(e.path()) < 0) continue;
    if (fs::exists(e.path() / kMetaFile))
      out.push_back(e.path());
    else if (incomplete)
      incomplete->push_back(e.path());
  }
  std::sort(out.begin(), out.end(),
            [](const fs::path& a, const fs::path& b) { return step_of(a) < step_of(b); });
  return out;
}

// The CRC-32C of each kCheckpointCrcBlockBytes block of n bytes, as "hex,hex,…".
std::string block_crcs(const void* data, size_t n) {
  std::string out;
  const auto* p = static_cast<const char*>(data);
  const size_t block = static_cast<size_t>(kCheckpointCrcBlockBytes);
  for (size_t at = 0; at < n || (n == 0 && out.empty()); at += block) {
    char crc[16];
    std::snprintf(crc, sizeof(crc), "%08x", crc32c(p + at, std::min(block, n - at)));
    if (!out.empty()) out += ',';
    out += crc;
    if (n == 0) break;
  }
  return out;
}

// This rank's tensor file into `dir` (values on the host), fsync'ed: each piece under its global
// name, with its geometry (".piece") and its block checksums (".crc32c").
void write_tensor_file(const fs::path& dir, const CheckpointContents& c, int rank) {
  std::map<std::string, std::string> meta;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const CheckpointTensor& t : c.tensors) {
    LOOM_CHECK(t.values.numel() == t.piece.numel(), "checkpoint: tensor '", t.name, "' has ",
               t.values.numel(), " values for a piece of ", t.piece.numel());
    Tensor h = t.values.detach().to(Device::cpu()).contiguous();
    // A whole box keeps its shape (what another reader expects); a flat range is 1-d.
    if (t.piece.begin != 0 || t.piece.end != shape_numel(t.piece.box_shape()))
      h = h.reshape({h.numel()});
    meta[t.name + ".piece"] = piece_str(t.piece);
    meta[t.name + ".crc32c"] = block_crcs(h.raw_data(), h.nbytes());
    tensors.emplace_back(t.name, h);
  }
  write_safetensors((dir / tensor_file(rank)).string(), tensors, meta);
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
    std::vector<fs::path> incomplete;
    std::vector<fs::path> all = complete_checkpoints(root, &incomplete);
    for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) {
      if (all[i] != final_dir) fs::remove_all(all[i]);
    }
    // Folders no save completes (no meta.yaml) older than this one, and temporary folders of
    // saves that were killed, are pruned with the old checkpoints.
    for (const fs::path& p : incomplete) {
      if (step_of(p) < step_of(final_dir)) fs::remove_all(p);
    }
    for (const auto& e : fs::directory_iterator(root)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && n.rfind(".step_", 0) == 0 && n.size() > 4 &&
          n.compare(n.size() - 4, 4, ".tmp") == 0)
        fs::remove_all(e.path());
    }
  }
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

CheckpointWriter::CheckpointWriter(const std::string& root, CheckpointContents c, int64_t keep,
                                   parallel::Communicator* comm, bool async)
    : root_(root), keep_(keep), comm_(comm), step_(c.step) {
  const int rank = comm ? comm->rank() : 0;
  const fs::path tmp = fs::path(root) / ("." + checkpoint_dir_name(c.step) + ".tmp");
  if (rank == 0) {
    try {
      fs::create_directories(root);
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }
  if (comm) comm->barrier();
  // The snapshot: host copies, so training may change the live tensors while the files are
  // written (and the device work the values wait for is done when this returns).
  try {
    for (CheckpointTensor& t : c.tensors) {
      LOOM_CHECK(t.values.defined(), "checkpoint: tensor '", t.name, "' is undefined");
      const Tensor h = t.values.detach().to(Device::cpu()).contiguous();
      t.values = async && h.storage() == t.values.storage() ? h.clone() : h;
    }
  } catch (const std::exception& e) {
    error_ = e.what();
  }
  auto write = [this, tmp, rank, contents = std::move(c), shards = comm ? comm->size() : 1] {
    if (!error_.empty()) return;
    try {
      write_tensor_file(tmp, contents, rank);
      if (rank == 0) write_meta((tmp / kMetaFile).string(), contents, shards);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  };
  if (async)
    thread_ = std::thread(std::move(write));
  else
    write();
}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();  // unpublished: the next save prunes its folder
}

std::string CheckpointWriter::finish() {
  if (thread_.joinable()) thread_.join();
  const int rank = comm_ ? comm_->rank() : 0;
  const fs::path final_dir = fs::path(root_) / checkpoint_dir_name(step_);
  const fs::path tmp = fs::path(root_) / ("." + checkpoint_dir_name(step_) + ".tmp");
  if (!all_ok(error_.empty(), comm_)) {
    if (rank == 0) fs::remove_all(tmp);  // the previous checkpoints are untouched
    if (comm_) comm_->barrier();
    LOOM_FAIL("checkpoint ", final_dir.string(),
              " not written: ", error_.empty() ? "another rank failed" : error_);
  }
  if (rank == 0) publish(root_, tmp, final_dir, keep_);
  if (comm_) comm_->barrier();
  return final_dir.string();
}

std::string save_checkpoint(const std::string& root, const CheckpointContents& c, int64_t keep,
                            parallel::Communicator* comm) {
  return CheckpointWriter(root, c, keep, comm, false).finish();
}

CheckpointTensor whole_tensor(const std::string& name, const Tensor& t) {
  return {name, t, whole_piece(t.shape())};
}

namespace {

// A meta.yaml field as T, naming the file and the key when it is missing or malformed.
template <typename T>
T meta_field(const YAML::Node& meta, const std::string& key, const std::string& path) {
  LOOM_INPUT_CHECK(meta[key], path, ": missing '", key, "'");
  try {
    return meta[key].as<T>();
  } catch (const YAML::Exception&) {
    LOOM_INPUT_FAIL(path, ": '", key, "' is not a valid value: ", YAML::Dump(meta[key]));
  }
}

std::vector<uint32_t> parse_crcs(const std::string& text, const std::string& what) {
  std::vector<uint32_t> out;
  std::istringstream in(text);
  std::string hex;
  while (std::getline(in, hex, ',')) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(hex.c_str(), &end, 16);
    LOOM_INPUT_CHECK(!hex.empty() && end == hex.c_str() + hex.size(), what,
                     ": malformed checksum '", text, "'");
    out.push_back(static_cast<uint32_t>(v));
  }
  return out;
}

}  // namespace

bool all_finite(const Tensor& host) {
  LOOM_CHECK(host.device().is_cpu() && host.is_contiguous(),
             "all_finite: needs a contiguous host tensor");
  if (!is_floating(host.dtype())) return true;
  if (host.dtype() == DType::kF32) {
    const float* p = static_cast<const float*>(host.raw_data());
    for (int64_t i = 0; i < host.numel(); ++i) {
      if (!std::isfinite(p[i])) return false;
    }
    return true;
  }
  for (double v : host.to_vector()) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  const std::string meta_path = (fs::path(dir) / kMetaFile).string();
  LOOM_INPUT_CHECK(fs::is_directory(dir) && fs::exists(meta_path), dir, ": not a checkpoint (no ",
                   kMetaFile, ")");
  YAML::Node meta;
  try {
    meta = YAML::LoadFile(meta_path);
  } catch (const YAML::Exception& e) {
    LOOM_INPUT_FAIL(meta_path, ": corrupt: ", e.what());
  }
  LOOM_INPUT_CHECK(meta.IsMap(), meta_path, ": corrupt: not a YAML map");
  const int version = meta_field<int>(meta, "format_version", meta_path);
  LOOM_INPUT_CHECK(version == kCheckpointFormatVersion, meta_path, ": format version ", version,
                   " is not supported (this Loom reads version ", kCheckpointFormatVersion, ")");
  step_ = meta_field<int64_t>(meta, "step", meta_path);
  LOOM_INPUT_CHECK(step_ >= 0, meta_path, ": 'step' is ", step_, "; a step is at least 0");
  if (meta["state"]) {
    try {
      for (const auto& kv : meta["state"])
        state_[kv.first.as<std::string>()] = kv.second.as<std::string>();
    } catch (const YAML::Exception&) {
      LOOM_INPUT_FAIL(meta_path, ": 'state' is not a map of names to values");
    }
  }
  YAML::Emitter cfg;
  cfg << meta["config"];
  config_yaml_ = cfg.c_str();
  const int shards = meta_field<int>(meta, "num_shards", meta_path);
  LOOM_INPUT_CHECK(shards >= 1, meta_path, ": 'num_shards' is ", shards);
  for (int r = 0; r < shards; ++r) {
    const std::string path = (fs::path(dir) / tensor_file(r)).string();
    LOOM_INPUT_CHECK(fs::exists(path), dir, ": missing tensor file ", tensor_file(r), " (of ",
                     shards, ")");
    const SafetensorsIndex index = read_safetensors_index(path);
    files_.push_back(path);
    for (const SafetensorsEntry& e : index.entries) {
      const std::string what = path + ": tensor '" + e.name + "'";
      auto piece = index.metadata.find(e.name + ".piece");
      auto crc = index.metadata.find(e.name + ".crc32c");
      LOOM_INPUT_CHECK(piece != index.metadata.end() && crc != index.metadata.end(), what,
                       " has no piece or checksum metadata");
      Stored s{files_.size() - 1,
               e.begin,
               e.end,
               e.dtype,
               parse_piece(piece->second, what),
               parse_crcs(crc->second, what)};
      LOOM_INPUT_CHECK(s.piece.numel() == shape_numel(e.shape), what, " holds ",
                       shape_numel(e.shape), " elements for a piece of ", s.piece.numel());
      const uint64_t blocks =
          std::max<uint64_t>(1, (e.end - e.begin + kCheckpointCrcBlockBytes - 1) /
                                    static_cast<uint64_t>(kCheckpointCrcBlockBytes));
      LOOM_INPUT_CHECK(s.crcs.size() == blocks, what, " has ", s.crcs.size(), " checksums for ",
                       blocks, " blocks");
      std::vector<Stored>& pieces = stored_[e.name];
      if (!pieces.empty()) {
        LOOM_INPUT_CHECK(
            pieces[0].piece.global_shape == s.piece.global_shape && pieces[0].dtype == s.dtype,
            what, " is a piece of a ", shape_str(s.piece.global_shape), " ", dtype_name(s.dtype),
            " tensor, another file's of a ", shape_str(pieces[0].piece.global_shape), " ",
            dtype_name(pieces[0].dtype));
      }
      pieces.push_back(std::move(s));
    }
  }
}

std::map<std::string, Shape> CheckpointReader::tensors() const {
  std::map<std::string, Shape> out;
  for (const auto& [name, pieces] : stored_) out[name] = pieces[0].piece.global_shape;
  return out;
}

void CheckpointReader::read_into(const std::string& name, const TensorPiece& piece,
                                 const Tensor& host) const {
  auto it = stored_.find(name);
  LOOM_INPUT_CHECK(it != stored_.end(), dir_, ": checkpoint has no tensor '", name, "'");
  const std::vector<Stored>& pieces = it->second;
  LOOM_INPUT_CHECK(pieces[0].piece.global_shape == piece.global_shape, dir_, ": '", name,
                   "' is stored with global shape ", shape_str(pieces[0].piece.global_shape),
                   " but the run's is ", shape_str(piece.global_shape));
  LOOM_INPUT_CHECK(pieces[0].dtype == host.dtype(), dir_, ": '", name, "' is stored as ",
                   dtype_name(pieces[0].dtype), " but the run holds it as ",
                   dtype_name(host.dtype()));
  const int64_t es = static_cast<int64_t>(dtype_size(host.dtype()));
  int64_t copied = 0;
  std::vector<char> buf;
  for (const Stored& s : pieces) {
    // The stored elements this piece needs: one span, widened to whole checksum blocks.
    int64_t lo = INT64_MAX, hi = -1;
    for_each_overlap(s.piece, piece, [&](int64_t si, int64_t, int64_t n) {
      lo = std::min(lo, si);
      hi = std::max(hi, si + n);
    });
    if (hi < 0) continue;
    const int64_t bytes = static_cast<int64_t>(s.end - s.begin);
    const int64_t b0 = lo * es / kCheckpointCrcBlockBytes * kCheckpointCrcBlockBytes;
    const int64_t b1 = std::min(bytes, (hi * es + kCheckpointCrcBlockBytes - 1) /
                                           kCheckpointCrcBlockBytes * kCheckpointCrcBlockBytes);
    buf.resize(static_cast<size_t>(b1 - b0));
    read_file_bytes(files_[s.file], s.begin + static_cast<uint64_t>(b0),
                    static_cast<uint64_t>(b1 - b0), buf.data());
    for (int64_t at = b0; at < b1; at += kCheckpointCrcBlockBytes) {
      const int64_t n = std::min(kCheckpointCrcBlockBytes, b1 - at);
      const uint32_t want = s.crcs[static_cast<size_t>(at / kCheckpointCrcBlockBytes)];
      LOOM_INPUT_CHECK(crc32c(buf.data() + (at - b0), static_cast<size_t>(n)) == want,
                       files_[s.file], ": tensor '", name,
                       "' is corrupt (checksum mismatch in bytes [", at, ", ", at + n, "))");
    }
    TensorPiece span = s.piece;  // the stored elements in buf
    span.begin = s.piece.begin + b0 / es;
    span.end = s.piece.begin + b1 / es;
    copied += copy_overlap(span, buf.data(), piece, host.raw_data(), static_cast<size_t>(es));
  }
  LOOM_INPUT_CHECK(copied == piece.numel(), dir_, ": '", name, "': ",
                   copied < piece.numel() ? "elements of the run's piece are stored nowhere"
                                          : "elements are stored more than once",
                   " (", copied, " of ", piece.numel(), " found; the run's piece ",
                   piece_str(piece), ")");
  LOOM_INPUT_CHECK(all_finite(host), dir_, ": '", name, "' holds NaN or infinite values");
}

void CheckpointReader::read(const std::string& name, const TensorPiece& piece,
                            const Tensor& dst) const {
  LOOM_INPUT_CHECK(dst.numel() == piece.numel() && dst.is_contiguous(), "checkpoint read of '",
                   name, "': the destination has ", dst.numel(), " elements for a piece of ",
                   piece.numel());
  if (dst.device().is_cpu()) {
    read_into(name, piece, dst);
    return;
  }
  Tensor host = Tensor::empty(dst.shape(), dst.dtype());
  read_into(name, piece, host);
  Tensor out = dst;
  ops::copy_(out, host.to(dst.device()));
}

DType CheckpointReader::dtype(const std::string& name) const {
  auto it = stored_.find(name);
  LOOM_INPUT_CHECK(it != stored_.end(), dir_, ": checkpoint has no tensor '", name, "'");
  return it->second[0].dtype;
}

Tensor CheckpointReader::read_whole(const std::string& name) const {
  auto it = stored_.find(name);
  LOOM_INPUT_CHECK(it != stored_.end(), dir_, ": checkpoint has no tensor '", name, "'");
  const Shape shape = it->second[0].piece.global_shape;
  // A damaged or hostile file must not make this allocate without bound (Note [Size bounds]).
  LOOM_INPUT_CHECK(shape_numel(shape) <= (int64_t{1} << 40), dir_, ": '", name,
                   "' claims a global shape ", shape_str(shape), " larger than Loom allocates");
  Tensor t = Tensor::empty(shape, it->second[0].dtype);
  read_into(name, whole_piece(shape), t);
  return t;
}

CheckpointContents load_checkpoint(const std::string& dir) {
  const CheckpointReader r(dir);
  CheckpointContents c;
  c.step = r.step();
  c.state = r.state();
  c.config_yaml = r.config_yaml();
  for (const auto& [name, shape] : r.tensors())
    c.tensors.push_back(whole_tensor(name, r.read_whole(name)));
  return c;
}

std::vector<std::string> checkpoints_newest_first(const std::string& root,
                                                  std::vector<std::string>* incomplete) {
  std::vector<fs::path> bad;
  std::vector<fs::path> all = complete_checkpoints(root, &bad);
  std::vector<std::string> out;
  for (auto it = all.rbegin(); it != all.rend(); ++it) out.push_back(it->string());
  if (incomplete) {
    for (const fs::path& p : bad) incomplete->push_back(p.string());
  }
  return out;
}

std::string latest_checkpoint(const std::string& root) {
  std::vector<fs::path> all = complete_checkpoints(root);
  return all.empty() ? "" : all.back().string();
}

std::string checkpoint_in(const std::string& dir) {
  if (!fs::is_directory(dir) || fs::exists(fs::path(dir) / "meta.yaml")) return dir;
  return latest_checkpoint(dir);
}

}  // namespace loom
