// train/planner/calibrate.h — the measured rates the step-time model (train/planner/step_time.h)
// composes: Loom's own forward and backward of one block and of the rest of the model (the
// embeddings, final norm, head and loss) at a micro-batch's shape, its linear layers and causal
// attention at the shapes a tensor- or context-parallel rank computes, and the optimizer's
// update per parameter — each timed on this process's device with this process's threads, and
// kept in a cache file keyed by the device and the shape, so a plan measures each shape once.
//
// Note [Compute calibration]: a block's time is not summed from FLOP counts at a peak rate —
// on a CPU the small GEMMs, the element-wise kernels and the autograd bookkeeping of a small
// model run far from any peak — but measured as the difference of two models built from the
// config that differ by one block: t(block) = (t(L = 3) − t(L = 1)) / 2, and the rest is
// t(L = 1) − t(block), forward and backward apart: the two models' passes alternate after a
// warm-up, 9 pairs, and the block is the median of the pairs' differences, the rest the median
// of the 1-block passes less it (a drift of the machine's speed moves both of a pair alike). Shapes
// a rank computes that one process does not (a tensor-parallel rank's column and row layers, its
// share of the heads; a context-parallel rank's ring attention, run by one process as rank 0 of a
// loopback ring whose transfers are local copies) are corrected with the measured time of exactly
// those linear layers and attention calls, against the same calls at the full shape. What the
// correction leaves at the full shape (norms, residual adds and the autograd overhead of one block)
// is the block's measured time minus its measured linears and attention.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "train/config.h"

namespace loom::planner {

// Seconds for one micro-batch, forward and backward apart.
struct PassTimes {
  double fwd = 0, bwd = 0;
  double total() const { return fwd + bwd; }
};

// Measured times on one device, cached by key (shape strings, below). The cache file is JSON:
// {"<device>": {"<key>": seconds, …}, …}; measurements of other devices are kept untouched.
class Calibration {
 public:
  // `path` empty: nothing is read or written (every measurement is taken in this process).
  // Measures on t's device (the CPU, or the first GPU) with the kernels the trainer would choose
  // there (train.allow_tf32, train.attention_kernel).
  // `gpu` (a driver's device name, "NVIDIA H200"): the plan is for that GPU. Where this process
  // computes on one, it measures as above; elsewhere it only reads that GPU's entries from the
  // file (measured there earlier), and a shape the file lacks is a ConfigError naming it.
  explicit Calibration(std::string path = "", const TrainConfig& t = TrainConfig{},
                       const std::string& gpu = "");
  // What the times are of: the CPU's BLAS kernel set and thread count, or the GPU's name and its
  // kernel choices.
  const std::string& device() const { return device_; }
  // True where the times are read from the file only (a GPU this process does not have).
  bool replay_only() const { return replay_; }

  // One block / the rest of the config's model (dropout, checkpointing and dtype as configured;
  // no parallelism) for a micro-batch of B rows of T tokens.
  PassTimes block(const ModelConfig& m, const TrainConfig& t, int64_t B, int64_t T);
  PassTimes rest(const ModelConfig& m, const TrainConfig& t, int64_t B, int64_t T);
  // The config's model with `layers` blocks, measured now (not cached): what
  // `--calibrate-links` times alone and with every rank computing at once; `timed` (optional)
  // runs once after the warm-up, just before the timed passes (the median of 5).
  PassTimes model_now(const ModelConfig& m, const TrainConfig& t, int64_t B, int64_t T,
                      int64_t layers, const std::function<void()>& timed = {});
  // A linear layer (rows × in → out, with bias or not), forward and backward.
  PassTimes linear(int64_t rows, int64_t in, int64_t out, bool bias, const std::string& dtype);
  // Causal attention over (B, heads, T, D) (kv heads `kv_heads`), forward and backward.
  PassTimes attention(int64_t B, int64_t heads, int64_t kv_heads, int64_t T, int64_t D,
                      const std::string& dtype);
  // A context-parallel rank's ring attention (parallel/cp/ring_attention.h) over cp ranks, its
  // local queries and keys (B, heads|kv_heads, T_local, D), forward and backward: the block
  // kernels, merges and copies it runs, with each ring transfer replaced by a local copy (the
  // transfers are priced from the links).
  PassTimes ring_attention(int64_t B, int64_t heads, int64_t kv_heads, int64_t T_local, int64_t D,
                           int64_t cp, const std::string& dtype);
  // GPT-2's MLP (rows × C → F → C, biases): fused (ops::gelu_mlp, the single-device layer) or
  // as the mesh's layers compute it (two linears and a GELU apart).
  PassTimes mlp(int64_t rows, int64_t C, int64_t F, bool fused, const std::string& dtype);
  // The softmax cross-entropy of rows × V logits (the loss's local work).
  PassTimes cross_entropy(int64_t rows, int64_t V, const std::string& dtype);
  // The host work of a table's sparse-rows reduction at the end of a data-parallel step
  // (Note [Early contributions and sparse rows] in parallel/dp/data_parallel.h): the row mask of
  // a rows × cols gradient `used` of whose rows are non-zero, the rows packed and unpacked, and,
  // `early`, the early contribution added; seconds (the transfers are priced from the links).
  double table_rows(int64_t rows, int64_t cols, int64_t used, bool early, const std::string& dtype);
  // The optimizer's update (AdamW, or SGD) of n parameters, seconds; optimizer_now measures
  // it again (not cached).
  double optimizer(const std::string& name, int64_t n, const std::string& dtype);
  double optimizer_now(const std::string& name, int64_t n, const std::string& dtype);

  // The cluster's measured links (`train --calibrate-links`), kept apart from the devices'
  // entries ("links": {"intra/latency": s, "intra/bandwidth": B/s, "inter/…"}).
  void set_link(const std::string& what, double value);
  std::optional<double> link(const std::string& what) const;

  // Writes the cache file when something was measured (no-op without a path).
  void save() const;

 private:
  PassTimes cached(const std::string& key, const std::function<PassTimes()>& measure);
  void model_times(const ModelConfig& m, const TrainConfig& t, int64_t B, int64_t T);

  // The entry `key` of a plan for a GPU this process does not have: a ConfigError.
  [[noreturn]] void missing(const std::string& key) const;

  std::string path_, device_;
  Device dev_;
  bool tf32_ = false, cudnn_attention_ = false, replay_ = false;
  std::map<std::string, double> times_;  // this device's entries ("key/fwd", "key/bwd")
  std::map<std::string, double> links_;
  bool changed_ = false;
};

}  // namespace loom::planner
