// train/trainer_state.h — Trainer::State, private to the trainer's files: the plan (model,
// step runner, gradient engine: train/plan.h) and the loop's own state
// (generators, step sources, loss scaler, schedule, step count, log). Its methods live by concern:
//   train/trainer.cpp      construction (build and its steps) and the loop (run)
//   train/train_step.cpp   one step: launch, finish on the device, report and log
//   train/checkpointing.cpp  checkpoints: save, resume, initial weights
//   train/sampling.cpp     validation, next-token logits, sampling
// Nothing outside train/ includes it.
#pragma once

#include <chrono>
#include <iosfwd>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "data/step_source.h"
#include "data/tokenizer.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/dp/dp_stats.h"
#include "parallel/gradients.h"
#include "parallel/pp/executor.h"
#include "train/metrics.h"
#include "train/noise_scale.h"
#include "train/plan.h"
#include "train/profiler.h"
#include "train/readback.h"
#include "train/run_lock.h"
#include "train/trainer.h"

namespace loom {

using Clock = std::chrono::steady_clock;

// The config's kernel choices for the calling thread, for a scope: TF32 for f32 GEMMs (Note
// [TF32]) and cuDNN's attention (Note [cuDNN attention]; `cudnn_attention` is
// train.attention_kernel as resolved at construction, resolve_attention_kernel). Held around
// every step, evaluation and sampling. Sampling grows the context one token at a time, and cuDNN
// would build (and keep) a graph for every new length, so sampling keeps Loom's attention kernels.
class CheckpointReader;
class CheckpointWriter;

struct KernelChoices {
  enum class Use { kStep, kSampling };
  kernels::AllowTf32Guard tf32;
  kernels::CudnnAttentionGuard attention;
  KernelChoices(const TrainConfig& t, bool cudnn_attention, Use use = Use::kStep)
      : tf32(t.allow_tf32), attention(cudnn_attention && use == Use::kStep) {}
};

// A step as train_step() leaves it: its record, still without the numbers the device computed,
// and the read of those numbers (Note [Device step]).
struct PendingStep {
  StepRecord r;
  // [loss, Σ g²] (under loss scaling: of the scaled gradients, then the scale the step used and
  // the loss scaler's state after it)
  Readback::Pending numbers;
  // The engine's gradient sync and the pipeline's schedule in this step, where they exist
  std::optional<parallel::DpStepStats> dp_stats;
  std::optional<parallel::pp::PipelineStats> pipe_stats;
  // Tensor and context parallelism: the compute thread's waits on their groups in this step
  double tp_wait_s = 0, cp_wait_s = 0;
  // Pipeline parallelism: the compute thread's waits on the pp group in this step (the
  // executor's receives and sends, the tied-embedding exchange, the loss broadcast)
  double pp_wait_s = 0;
  // The step's input tokens (every rank's); with data.packing how they split over the dp ranks
  // (before padding: StepData)
  int64_t tokens = 0;
  std::vector<int64_t> rank_tokens, rank_micro_batches;
  // A step without loss tokens, skipped (Trainer::State::skipped_step): no numbers
  bool no_loss_tokens = false;
  // train.noise_scale: where the first micro-batch's Σ g² sits in `numbers`, or -1
  int noise_index = -1;
};

std::string fmt(double v, int precision, bool sci = false);
double seconds_since(Clock::time_point t0);

struct Trainer::State {
  Config cfg;
  TrainerOptions opt;
  std::ostream* log;
  TrainPlan plan;
  Device device;                              // train.device, resolved
  bool cudnn_attention = false;               // train.attention_kernel, resolved
  std::string attention_choice;               // why (resolve_attention_kernel), for the log
  std::unique_ptr<optim::LossScaler> scaler;  // train.loss_scaling (f16 by default)
  uint64_t dropout_seed = 0;                  // train.seed + 1 (Note [Dropout by coordinates])
  Generator sample_gen{0};
  parallel::ParallelContext* ctx = nullptr;
  std::unique_ptr<TraceRecorder> trace;  // --profile
  std::ostream discard{nullptr};         // the log of ranks other than 0
  optim::LrSchedule schedule;
  // The steps' data (data/step_source.h): fixed-length windows, or with data.packing whole
  // documents. val_data only with data.val.
  std::unique_ptr<StepSource> train_data;
  std::unique_ptr<StepSource> val_data;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<MetricsWriter> metrics;
  NoiseScale noise;   // train.noise_scale (Note [Gradient noise scale] in train/noise_scale.h)
  Readback readback;  // the device step's numbers (Note [Device step])
  int64_t step = 0;
  double peak_flops = 0;
  std::unique_ptr<CheckpointWriter> pending_save;  // checkpoint.async: the save in flight
  // Rank 0 holds train.out_dir from construction to the end of run() (train/run_lock.h).
  std::unique_ptr<RunLock> run_lock;

  Transformer& model() const { return *plan.model; }
  // train/trainer.cpp: build() runs these steps in this order.
  void build();
  void seed_generators();
  void build_device_and_scaler();
  void build_training_plan();  // the model's initial weights drawn first from train.seed
  void build_data();
  void lock_out_dir();
  void write_effective_config();
  void open_metrics();
  void find_peak_flops();
  void log_setup() const;
  void join_peers();  // after build and resume (Note [Joining running peers])
  bool is_main() const { return !ctx || ctx->rank() == 0; }
  int tp_size() const { return ctx ? ctx->tp_size() : 1; }
  int cp_size() const { return ctx ? ctx->cp_size() : 1; }
  bool has_val() const { return val_data != nullptr; }

  // train/train_step.cpp (Note [Device step]).
  PendingStep train_step();
  PendingStep skipped_step(const StepData& data);  // no loss tokens: no update
  // The end of every step, after the gradients are final: loss (the global batch's, one element)
  // and Σ g² (every rank's parts summed) on the device. Starts reading both and runs the
  // optimizer with the factor computed on the device: clipping, and under loss scaling the
  // unscaling and the skip of an overflowed step (Note [Device step]).
  void finish_step(PendingStep& pending, const Tensor& loss, const Tensor& sq_sum);
  // Completes p's record (waiting for its numbers if they are still on their way) and logs it,
  // timed from `since`, which becomes the moment its numbers reached the host — or, when p is
  // the last step launched (nothing after it absorbs the rest of its work: the optimizer, a
  // scheme's step-end exchange such as DiLoCo's sync), the moment it is reported.
  void report(PendingStep& p, Clock::time_point& since, bool last_launched);
  // dt: the step's seconds; the step's communication and schedule statistics.
  void log_step(const PendingStep& p, double dt);

  // train/checkpointing.cpp (Note [Exact resume] in train/trainer.h).
  void save();
  // Note [Stopping inside long loops] (train/sampling.cpp); collective when the forward is.
  bool stop_requested();
  // Publishes the save still writing in the background, if any (collective; Note
  // [Asynchronous checkpoints] in train/checkpoint.h).
  void finish_pending_save();
  void resume(const std::string& which);  // Note [Resume fallback]
  void resume_from(const std::string& dir);
  // Note [Resume compatibility]: throws ConfigError naming the keys a run cannot change;
  // logs the others.
  void check_resume_config(const CheckpointReader& r);
};

}  // namespace loom
