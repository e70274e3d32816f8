// train/trainer.h — the training loop: builds the plan (model, step runner, gradient
// finalisation, optimizer: train/plan.h), schedule and data loaders from a Config, runs steps
// (micro-batch accumulation, clipping, AdamW/SGD, any parallel layout), logs metrics, evaluates,
// samples text, and writes checkpoints it can resume from exactly. Step callbacks let a fork
// add behaviour around each step without copying it (an outer optimizer every H steps, say).
//
// Note [Exact resume]: a checkpoint holds the parameters, the optimiser state and step count,
// the data loader's position, and the sampling generator's state; dropout masks are a function
// of the step (Note [Dropout by coordinates] in layers/dropout_key.h), so they need no state. Every
// kernel is deterministic for a given thread count layout (see docs/core.md), so N steps, a stop, a
// resume and N more steps give the same bits as 2N steps in one run.
#pragma once

#include <atomic>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/packed_loader.h"
#include "train/config.h"

namespace loom {
namespace parallel {
class ParallelContext;
}

struct StepRecord {
  int64_t step = 0;  // 1-based: the number of optimizer steps done after this one
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  bool skipped = false;  // f16: the gradients overflowed, the optimizer step was skipped
  double seconds = 0;    // the step's time (Note [Device step]), as logged
  // Data parallelism: seconds this rank's compute thread was blocked waiting for communication
  // (gathers, pulls, the step's final synchronisation), the idle time imbalance shows up as.
  double comm_blocked_s = 0;
  // train.noise_scale: the gradient noise scale so far, in tokens (train/noise_scale.h)
  std::optional<double> noise_scale;
};

class Trainer;

// Called on every rank, in the loop's order (every field may be empty). A callback that changes
// the parameters (through Trainer::trained_parameters(), in place, outside autograd) must do the
// same on every rank of a replica and keep any collective it issues in the same order on all.
struct StepCallbacks {
  // Before step `step` (1-based: the one about to run) is launched.
  std::function<void(Trainer&, int64_t step)> before_step;
  // Once step `step`'s optimizer update is launched (reading a parameter waits for it). Runs
  // before the step is reported: its numbers may still be on the device.
  std::function<void(Trainer&, int64_t step)> after_update;
  // Once the step's record is complete (loss, norm read back) and logged.
  std::function<void(Trainer&, const StepRecord&)> after_report;
};

struct TrainerOptions {
  std::string resume;                       // "", "latest" or a checkpoint directory
  const std::atomic<bool>* stop = nullptr;  // set by a signal handler: checkpoint and stop
  int64_t stop_at_step = 0;  // > 0: checkpoint and stop once this step is done (time-limited jobs)
  std::ostream* log = nullptr;  // step lines and messages (null: std::cout)
  bool print_config = false;    // the effective config in full on the log (it is always written
                                // to <train.out_dir>/config.yaml)
  // Data or pipeline parallelism (parallel.dp or parallel.pp > 1): this rank's context, built by
  // the caller from the config's parallel section (tools/train.cpp). Null: a single process.
  parallel::ParallelContext* parallel = nullptr;
  // Non-empty: write a Chrome/Perfetto trace of this rank here at the end (train/profiler.h).
  std::string profile_path;
  StepCallbacks callbacks;
};

class Trainer {
 public:
  Trainer(Config config, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs until train.steps (or a stop request); returns the steps run by this call.
  std::vector<StepRecord> run();
  // Mean validation loss over train.val_steps batches from the start of the val shards. Under
  // tp/cp/pp collective (every rank calls it; under pp a forward-only pass through the stages),
  // the same value on every rank of a data-parallel replica.
  double evaluate();
  // Text generated from <|endoftext|> with the configured temperature and top-k. Collective
  // under ZeRO-3 and tp/cp/pp (every rank calls it and gets the same text, Note [Sampling
  // across ranks] in train/sampling.cpp).
  std::string sample(int64_t tokens);
  // The logits (real vocabulary) of the token after `context` (the last model.max_seq_len
  // tokens, fewer when the layout needs a multiple), the same on every rank. Collective like
  // sample().
  std::vector<double> next_token_logits(const std::vector<int32_t>& context);

  int64_t step() const;
  std::string checkpoint_root() const;
  // Every parameter, in order (for tests comparing runs). Under parallel.pp > 1 those of other
  // stages are released placeholders (Note [Pipeline model memory] in parallel/pp/pipeline.h);
  // under ZeRO-3, copies gathered collectively (call it on every rank).
  std::vector<std::pair<std::string, Tensor>> parameters() const;
  // The parameters this rank trains: all of them, or with parallel.pp > 1 those of its
  // pipeline stages (the others stay at their initial values on this rank).
  std::vector<std::pair<std::string, Tensor>> trained_parameters() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// The shard files matching a glob (data.train, data.val), sorted; a ConfigError naming `key`
// when nothing matches.
std::vector<std::string> expand_shards(const std::string& pattern, const char* key);

// Data rank `data_rank` of `data_ranks`'s packing of data.train (Note [Packed steps] in
// data/packed_loader.h); `equal_micro_batches` as the engine needs it (ZeRO-3 with collectives).
// The trainer's and the planner's (train/planner/packed_steps.h) one source.
PackingOptions packing_options(const Config& cfg, int64_t data_rank, int64_t data_ranks,
                               bool equal_micro_batches);

// FLOP/s of a short square GEMM in `dtype` on `device` (the practical peak used for MFU).
double measure_gemm_flops(Device device = {}, DType dtype = DType::kF32);

// train.attention_kernel on this device: cudnn → true, loom → false; auto → true on CUDA with
// bf16/f16 compute where cuDNN's attention is built and libcudnn loads (measured faster in every
// case on an H200, docs/performance.md), else false. `why` gets the reason for the choice, for
// the setup log (the planner's calibration makes the same choice).
bool resolve_attention_kernel(const TrainConfig& t, const Device& device, std::string* why);

}  // namespace loom
