// data/loader.cpp — DataLoader (see Note [Loader windows] in data/loader.h): windows over the
// concatenated shard stream, a per-epoch Philox permutation, and rank slicing of global batches.
#include "data/loader.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>

#include "core/error.h"
#include "core/philox.h"

namespace loom {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::string shard_list(const std::vector<std::string>& paths) {
  std::string s;
  for (size_t i = 0; i < paths.size() && i < 3; ++i) s += (i ? ", " : "") + paths[i];
  if (paths.size() > 3) s += ", ... (" + std::to_string(paths.size()) + " shards)";
  return s;
}

}  // namespace

std::vector<int64_t> loader_permutation(int64_t num_windows, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(num_windows));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  const uint64_t key = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch)));
  for (int64_t i = num_windows - 1; i > 0; --i) {
    const Philox4 r = philox4x32(static_cast<uint64_t>(i), key);
    const uint64_t bits = (static_cast<uint64_t>(r.v[1]) << 32) | r.v[0];
    // Lemire's multiply-shift: uniform in [0, i] up to a bias below 2^-40 for any real size.
    const auto j = static_cast<int64_t>(
        (static_cast<unsigned __int128>(bits) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

namespace {

// Every token of a shard below vocab_size, else an error naming the shard and the offset.
void check_tokens(const ShardReader& shard, int64_t vocab_size) {
  const int64_t at = first_token_at_or_above(shard.tokens(), vocab_size);
  if (at < 0) return;
  LOOM_INPUT_FAIL(shard.path(), ": token ", shard.tokens()[at], " at offset ", at, " (of ",
                  shard.num_tokens(), " tokens) is outside model.vocab_size ", vocab_size,
                  " (the shard was written for another vocabulary?)");
}

}  // namespace

DataLoader::DataLoader(const std::vector<std::string>& shard_paths, int64_t B, int64_t T, int rank,
                       int world_size, uint64_t seed, int64_t vocab_size)
    : B_(B), T_(T), rank_(rank), world_size_(world_size), seed_(seed) {
  LOOM_CHECK(B > 0 && T > 0, "DataLoader: B and T must be positive, got B=", B, " T=", T);
  LOOM_CHECK(world_size > 0 && rank >= 0 && rank < world_size, "DataLoader: rank ", rank,
             " is outside world_size ", world_size);
  LOOM_CHECK(!shard_paths.empty(), "DataLoader: no shard files given");
  for (const std::string& p : shard_paths) {
    shards_.emplace_back(p);
    if (vocab_size > 0) check_tokens(shards_.back(), vocab_size);
    shard_start_.push_back(num_tokens_);
    num_tokens_ += shards_.back().num_tokens();
  }
  LOOM_CHECK(num_tokens_ >= T + 1, "DataLoader: shards ", shard_list(shard_paths), " hold ",
             num_tokens_, " tokens, fewer than one window of T+1 = ", T + 1, " tokens");
  num_windows_ = (num_tokens_ - 1) / T;
  const int64_t global = B * world_size;
  LOOM_CHECK(num_windows_ >= global, "DataLoader: shards ", shard_list(shard_paths), " hold ",
             num_tokens_, " tokens = ", num_windows_, " windows of T+1 = ", T + 1,
             " tokens, fewer than one global batch of B*world_size = ", global, " windows");
}

std::string fingerprint_entry(const std::string& path, const std::string& what) {
  return std::filesystem::path(path).filename().string() + ": " + what;
}

std::string data_change(const std::string& saved, const std::string& now) {
  if (saved == now) return "";
  auto entries = [](const std::string& print) {
    std::map<std::string, std::string> out;  // base name -> what
    for (size_t at = 0; at < print.size();) {
      size_t end = print.find("; ", at);
      if (end == std::string::npos) end = print.size();
      const std::string e = print.substr(at, end - at);
      const size_t colon = e.find(": ");
      out[e.substr(0, colon)] = colon == std::string::npos ? "" : e.substr(colon + 2);
      at = end + 2;
    }
    return out;
  };
  const auto was = entries(saved), is = entries(now);
  for (const auto& [name, what] : is) {
    const auto it = was.find(name);
    if (it == was.end()) return name + " is new (" + what + ")";
    if (it->second != what) return name + " now holds " + what + ", then " + it->second;
  }
  for (const auto& [name, what] : was) {
    if (!is.count(name)) return name + " (" + what + ") is gone";
  }
  return "the shards' order changed";
}

std::string DataLoader::fingerprint() const {
  std::string out;
  for (const ShardReader& s : shards_) {
    out += (out.empty() ? "" : "; ") +
           fingerprint_entry(s.path(), std::to_string(s.num_tokens()) + " tokens");
  }
  return out;
}

void DataLoader::set_state(LoaderState state) {
  LOOM_CHECK(state.epoch >= 0 && state.position >= 0 && state.position <= num_windows_,
             "DataLoader::set_state: epoch ", state.epoch, " position ", state.position,
             " is outside this data's ", num_windows_,
             " windows (saved with other shards or another T?)");
  epoch_ = state.epoch;
  position_ = state.position;
}

void DataLoader::ensure_permutation() {
  if (perm_epoch_ == epoch_) return;
  perm_ = loader_permutation(num_windows_, seed_, epoch_);
  perm_epoch_ = epoch_;
}

void DataLoader::copy_window(int64_t window, int32_t* dst) const {
  int64_t pos = window * T_, left = T_ + 1;
  // The shard holding `pos`: the last one starting at or before it (skipping empty shards).
  auto it = std::upper_bound(shard_start_.begin(), shard_start_.end(), pos);
  auto s = static_cast<size_t>(it - shard_start_.begin()) - 1;
  while (left > 0) {
    const ShardReader& shard = shards_[s];
    const int64_t off = pos - shard_start_[s];
    const int64_t n = std::min(left, shard.num_tokens() - off);
    shard.tokens().subspan(off, n).copy_to(dst);
    dst += n;
    pos += n;
    left -= n;
    ++s;
  }
}

Batch DataLoader::next() {
  const int64_t global = B_ * world_size_;
  if (position_ + global > num_windows_) {
    ++epoch_;
    position_ = 0;
  }
  ensure_permutation();
  Batch batch{Tensor::empty({B_, T_}, DType::kI32), Tensor::empty({B_, T_}, DType::kI32)};
  int32_t* inputs = batch.inputs.data<int32_t>();
  int32_t* targets = batch.targets.data<int32_t>();
  std::vector<int32_t> window(static_cast<size_t>(T_ + 1));
  for (int64_t b = 0; b < B_; ++b) {
    const int64_t w = perm_[static_cast<size_t>(position_ + rank_ * B_ + b)];
    copy_window(w, window.data());
    std::copy(window.begin(), window.end() - 1, inputs + b * T_);
    std::copy(window.begin() + 1, window.end(), targets + b * T_);
  }
  position_ += global;
  return batch;
}

}  // namespace loom
