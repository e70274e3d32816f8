// train/trainer.cpp — the trainer's construction and its loop (train/trainer.h; the state and
// where each of its parts lives: train/trainer_state.h). The loop never branches on the layout:
// the plan (train/plan.h) runs the step, and the step callbacks let a fork add behaviour.
#include "train/trainer.h"

#include <glob.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/autograd.h"
#include "core/ops/matmul.h"
#include "kernels/copy.h"
#include "parallel/launcher.h"
#include "train/checkpoint.h"
#include "train/convert.h"
#include "train/trainer_state.h"

namespace loom {
namespace fs = std::filesystem;

std::string fmt(double v, int precision, bool sci) {
  std::ostringstream os;
  if (sci)
    os << std::scientific;
  else
    os << std::fixed;
  os << std::setprecision(precision) << v;
  return os.str();
}

std::vector<std::string> expand_shards(const std::string& pattern, const char* key) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (out.empty())
    throw ConfigError(std::string(key) + ": no shard file matches '" + pattern + "'");
  return out;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

namespace {

// train.device → the device this process trains on: the CPU, or the GPU numbered by the
// launcher's node-local rank modulo the GPUs this process sees (a parallel context with NCCL
// communicators overrides it with the GPU it picked: Trainer::State::build_device_and_scaler).
Device resolve_device(const TrainConfig& t) {
  if (t.device == "cpu") return Device::cpu();
  if (!kernels::Registry::instance().has(kernels::device_count_k::kName, DeviceType::kCuda)) {
    throw ConfigError(
        "train.device: cuda, but this build has no CUDA backend (configure with -DLOOM_CUDA=ON)");
  }
  const int visible = device_count(DeviceType::kCuda);
  if (visible == 0)
    throw ConfigError("train.device: cuda, but no CUDA device is visible to this process");
  const int local_rank = std::max(0, parallel::local_rank_from_env());
  return Device::cuda(local_rank % visible);
}

}  // namespace

PackingOptions packing_options(const Config& cfg, int64_t data_rank, int64_t data_ranks,
                               bool equal_micro_batches) {
  const DataConfig& d = cfg.data;
  PackingOptions po;
  po.docs_per_rank = d.batch_size;
  po.max_len = d.seq_len;
  po.max_tokens =
      d.max_tokens_per_microbatch > 0 ? d.max_tokens_per_microbatch : d.batch_size * d.seq_len;
  po.balance = parse_balance_mode(d.balance);
  // a·s² + b·s: the model's FLOPs of a document of s tokens (Note [Model FLOPs]).
  const double linear = model_flops_per_token(cfg.model, 0);
  po.cost = {model_flops_per_token(cfg.model, 1) - linear, linear};
  po.equal_micro_batches = equal_micro_batches;
  po.rank = static_cast<int>(data_rank);
  po.world_size = static_cast<int>(data_ranks);
  po.seed = d.seed;
  po.vocab_size = cfg.model.vocab_size;
  return po;
}

double measure_gemm_flops(Device device, DType dtype) {
  autograd::NoGradGuard no_grad;
  Generator gen(0);
  const int64_t n = device.is_cpu() ? 1024 : 4096;
  Tensor a = randn({n, n}, gen, DType::kF32, 0.0, 1.0, device).to(dtype);
  Tensor b = randn({n, n}, gen, DType::kF32, 0.0, 1.0, device).to(dtype);
  // Reading one element waits for the device, so each timing covers the whole GEMM (the first
  // call also waits for the copies above and is a warm-up).
  auto wait = [](const Tensor& c) {
    return c.narrow(0, 0, 1).narrow(1, 0, 1).to(Device::cpu()).item();
  };
  wait(ops::matmul(a, b));
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    wait(ops::matmul(a, b));
    const double dt = seconds_since(t0);
    best = std::max(
        best, 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / dt);
  }
  return best;
}

// Construction, step by step; the order is the order of the side effects (the generators'
// seeds first, the model's initial weights drawn before anything else uses their generator, the
// device before its first use, the data before the out_dir is locked).
void Trainer::State::build() {
  seed_generators();
  build_device_and_scaler();
  build_training_plan();
  build_data();
  lock_out_dir();
  write_effective_config();
  open_metrics();
  find_peak_flops();
  log_setup();
}

bool resolve_attention_kernel(const TrainConfig& t, const Device& device, std::string* why) {
  if (t.attention_kernel != "auto") {
    *why = (t.attention_kernel == "cudnn" ? "cuDNN's fused attention where it handles the case"
                                          : "Loom's kernels") +
           std::string(" (train.attention_kernel: ") + t.attention_kernel + ")";
    return t.attention_kernel == "cudnn";
  }
  std::string reason;
  if (device.is_cpu()) {
    reason = "the CPU has Loom's kernels only";
  } else if (t.precision != "bf16" && t.precision != "f16") {
    reason = "cuDNN's attention takes bf16/f16 only, the compute is " + t.precision;
  } else if (kernels::cudnn_attention_loadable(&reason)) {
    *why = "cuDNN's fused attention where it handles the case (train.attention_kernel: auto)";
    return true;
  }
  *why = "Loom's kernels (train.attention_kernel: auto; " + reason + ")";
  return false;
}

// The streams of train.seed: the initial weights draw from the seed itself
// (build_training_plan), dropout from seed + 1 (Note [Dropout by coordinates]), sampling from
// seed + 2.
void Trainer::State::seed_generators() {
  dropout_seed = cfg.train.seed + 1;
  sample_gen = Generator(cfg.train.seed + 2);
}

void Trainer::State::build_device_and_scaler() {
  device = resolve_device(cfg.train);
  // A context with NCCL communicators has picked this rank's GPU already: train there.
  if (!device.is_cpu() && ctx && !ctx->device().is_cpu()) device = ctx->device();
  set_current_device(device);  // before this rank's first CUDA call (no context on GPU 0)
  cudnn_attention = resolve_attention_kernel(cfg.train, device, &attention_choice);
  if (cfg.train.loss_scaling == "dynamic" ||
      (cfg.train.loss_scaling == "auto" && cfg.train.precision == "f16")) {
    scaler = std::make_unique<optim::LossScaler>(cfg.train.initial_loss_scale);
    scaler->to(device);  // decided there (Note [Device step])
  }
}

// The model (its initial weights the first draw from train.seed), its engine and step runner
// (train/plan.h); the learning-rate schedule.
void Trainer::State::build_training_plan() {
  Generator init_gen(cfg.train.seed);
  PlanHooks hooks;
  hooks.trace = trace.get();
  hooks.log = log;
  hooks.init = [&](Transformer& m) {  // the single process's draw, before anything is sharded
    m.init_weights(init_gen);
    if (!cfg.train.init_from.empty()) load_model_weights(m, cfg.train.init_from, *log);
  };
  plan = build_plan(cfg, ctx, device, hooks);
  const OptimConfig& o = cfg.optim;
  schedule = {o.schedule, o.lr, o.min_lr, o.warmup_steps, cfg.train.steps, o.decay_fraction};
}

// The step sources of data.train and data.val (data/step_source.h): this replica's share of
// each training step, and every validation step whole on every rank.
void Trainer::State::build_data() {
  const DataConfig& d = cfg.data;
  auto opened = [&](std::unique_ptr<StepSource> source) {
    if (const std::string line = source->summary(); !line.empty()) *log << line << "\n";
    return source;
  };
  if (d.packing) {  // whole documents (Note [Packed steps] in data/packed_loader.h)
    // ZeRO-3's per-unit collectives need every rank to run as many micro-batches; ODC does not.
    PackingOptions po =
        packing_options(cfg, plan.data_rank, plan.data_ranks, plan.engine->equal_micro_batches());
    train_data = opened(std::make_unique<PackedSource>(
        std::make_unique<PackedLoader>(expand_shards(d.train, "data.train"), po)));
    if (!d.val.empty()) {
      po.docs_per_rank = d.batch_size * plan.data_ranks;  // the global minibatch's documents
      po.rank = 0;
      po.world_size = 1;
      po.equal_micro_batches = false;
      po.key = "data.val";
      val_data = opened(std::make_unique<PackedSource>(
          std::make_unique<PackedLoader>(expand_shards(d.val, "data.val"), po)));
    }
    return;
  }
  // Windows: a step is the runner's micro-batches (optim.grad_accum, or the pipeline's) of this
  // replica's batches; a validation step one whole batch.
  train_data = opened(std::make_unique<WindowSource>(
      std::make_unique<DataLoader>(expand_shards(d.train, "data.train"), d.batch_size, d.seq_len,
                                   plan.data_rank, plan.data_ranks, d.seed, cfg.model.vocab_size),
      plan.runner->micro_batches()));
  if (!d.val.empty()) {
    val_data = opened(std::make_unique<WindowSource>(
        std::make_unique<DataLoader>(expand_shards(d.val, "data.val"), d.batch_size, d.seq_len, 0,
                                     1, d.seed, cfg.model.vocab_size),
        1));
  }
}

// One run per out_dir: rank 0 locks it, and every rank stops alike when it cannot.
void Trainer::State::lock_out_dir() {
  std::string busy;
  if (is_main()) {
    try {
      run_lock = std::make_unique<RunLock>(cfg.train.out_dir);
    } catch (const ConfigError& e) {
      busy = e.what();
    }
  }
  Tensor flag = Tensor::full({1}, busy.empty() ? 0.0 : 1.0, DType::kF64);
  if (ctx) ctx->world().all_reduce(flag, parallel::ReduceOp::kMax);
  if (flag.item() != 0.0)
    throw ConfigError(busy.empty() ? "train.out_dir: in use by another run (see rank 0)" : busy);
}

// The effective config (every key, defaults included) beside the run's checkpoints and
// metrics; printed in full only with --print-config, so the first screen shows training.
void Trainer::State::write_effective_config() {
  fs::create_directories(cfg.train.out_dir);
  if (!is_main()) return;
  const fs::path path = fs::path(cfg.train.out_dir) / "config.yaml";
  std::ofstream out(path);
  out << config_to_yaml(cfg);
  if (!out.flush())
    throw std::runtime_error("cannot write the effective config to " + path.string());
  *log << "effective config: " << path.string() << " (--print-config prints it)\n";
}

void Trainer::State::open_metrics() {
  if (is_main() && (cfg.logging.jsonl || cfg.logging.tensorboard)) {
    metrics = std::make_unique<MetricsWriter>(cfg.train.out_dir, cfg.logging.jsonl,
                                              cfg.logging.tensorboard);
  }
}

void Trainer::State::find_peak_flops() {
  if (cfg.train.peak_flops > 0) {
    peak_flops = cfg.train.peak_flops;
    return;
  }
  kernels::AllowTf32Guard tf32(cfg.train.allow_tf32);
  peak_flops = measure_gemm_flops(device, train_dtype(cfg.train.precision));
}

// The model, the device and its peak, the plan's layout and the global batch.
void Trainer::State::log_setup() const {
  const ModelConfig& mc = cfg.model;
  // The whole model's counts, whatever this rank holds; then what this rank trains when that
  // is a part (tensor-parallel parts, its pipeline stages).
  int64_t trained = 0;
  for (const auto& [name, p] : plan.trained()) trained += p.numel();
  const int64_t total = count_parameters(mc);
  *log << "model: " << mc.arch << ", " << count_parameters(mc, true) << " parameters (" << total
       << " with vocab padding";
  if (trained != total) *log << "; this rank trains " << trained;
  *log << ") on " << device.str() << ", " << cfg.train.precision << " compute; peak "
       << fmt(peak_flops / 1e9, 1) << " GFLOP/s ("
       << (cfg.train.peak_flops > 0 ? "config" : "measured " + cfg.train.precision + " GEMM")
       << ")";
  // Which OpenBLAS kernel set the CPU GEMMs (and so the peak above) ran on.
  if (device.is_cpu()) *log << "; OpenBLAS " << kernels::cpu_blas_core() << " kernels";
  *log << "\n";
  if (!device.is_cpu()) *log << "attention: " << attention_choice << "\n";
  *log << plan.describe();
  if (ctx) *log << ctx->topology() << "\n";  // how the groups map to hosts
  if (cfg.data.global_batch > 0) {           // Note [Global batch] in train/config.cpp
    *log << "global batch: " << cfg.data.global_batch << " sequences = data.batch_size "
         << cfg.data.batch_size << " × parallel.dp " << cfg.parallel.dp << " × optim.grad_accum "
         << cfg.optim.grad_accum << " (data.global_batch)\n";
  }
}

Trainer::Trainer(Config config, TrainerOptions options) : s_(std::make_unique<State>()) {
  s_->cfg = std::move(config);
  s_->opt = options;
  s_->ctx = options.parallel && options.parallel->world_size() > 1 ? options.parallel : nullptr;
  s_->log = options.log ? options.log : &std::cout;
  if (!s_->is_main()) s_->log = &s_->discard;
  if (options.print_config) *s_->log << "effective config:\n" << config_to_yaml(s_->cfg) << "\n";
  if (!options.profile_path.empty()) {
    s_->trace = std::make_unique<TraceRecorder>(s_->ctx ? s_->ctx->rank() : 0);
    if (s_->ctx)
      s_->ctx->set_observer([t = s_->trace.get()](const parallel::CommEvent& e) { t->comm(e); });
  }
  s_->build();
  if (!options.resume.empty()) s_->resume(options.resume);
  s_->join_peers();
}

// Note [Joining running peers] in parallel/engine.h: the engine learns where the run starts and
// may move it to where its running peers are (a DiLoCo island restarting while the others
// train). Inside engine.step() the step being finished is not counted yet: `now` counts it.
void Trainer::State::join_peers() {
  const LoaderState d = train_data->state();
  const parallel::RunPosition here{step, d.epoch, d.position};
  auto now = [this] {
    const LoaderState at = train_data->state();
    return parallel::RunPosition{step + 1, at.epoch, at.position};
  };
  const std::optional<parallel::RunPosition> at = plan.engine->start(here, now);
  if (!at) return;
  step = at->step;
  train_data->set_state({at->data_epoch, at->data_position});
  if (metrics) metrics->resumed_at(step);
  *log << "joined running peers: continuing at step " << step << "\n";
}

Trainer::~Trainer() = default;

int64_t Trainer::step() const { return s_->step; }

std::string Trainer::checkpoint_root() const {
  return (fs::path(s_->cfg.train.out_dir) / "checkpoints").string();
}

std::vector<std::pair<std::string, Tensor>> Trainer::parameters() const {
  return s_->plan.parameters();
}

std::vector<std::pair<std::string, Tensor>> Trainer::trained_parameters() const {
  return s_->plan.trained();
}

std::vector<StepRecord> Trainer::run() {
  State& s = *s_;
  const TrainConfig& t = s.cfg.train;
  std::vector<StepRecord> records;
  Clock::time_point since = Clock::now();  // the start of the interval the next report times
  auto report = [&](PendingStep& p, bool last_launched) {
    s.report(p, since, last_launched);
    records.push_back(p.r);
    if (s.opt.callbacks.after_report) s.opt.callbacks.after_report(*this, p.r);
  };
  std::optional<PendingStep> prev;  // launched, reported once its successor is launched
  const StepCallbacks& cb = s.opt.callbacks;
  while (s.step < t.steps) {
    if (cb.before_step) cb.before_step(*this, s.step + 1);
    PendingStep p = s.train_step();
    if (cb.after_update) cb.after_update(*this, p.r.step);
    if (prev) {  // the device is busy with p while the host waits for prev's numbers
      report(*prev, false);
      prev.reset();
    }
    const int64_t n = p.r.step;
    const bool validate = s.has_val() && t.val_every > 0 && (n % t.val_every == 0 || n == t.steps);
    const bool sample_now = (s.is_main() || s.plan.collective_forward()) && t.sample_every > 0 &&
                            (n % t.sample_every == 0 || n == t.steps);
    bool stop =
        (s.opt.stop && s.opt.stop->load()) || (s.opt.stop_at_step > 0 && n >= s.opt.stop_at_step);
    if (s.ctx) {  // every rank must agree, since checkpointing is collective
      Tensor flag = Tensor::full({1}, stop ? 1.0 : 0.0, DType::kF64);
      s.ctx->world().all_reduce(flag, parallel::ReduceOp::kMax);
      stop = flag.item() > 0;
    }
    const bool periodic = s.cfg.checkpoint.every > 0 && n % s.cfg.checkpoint.every == 0;
    const bool save = stop || periodic || (n == t.steps && s.cfg.checkpoint.at_end);
    if (n < t.steps && !validate && !sample_now && !save) {  // Note [Device step]
      prev.emplace(std::move(p));
      continue;
    }
    report(p, true);
    if (validate) {
      const double v = evaluate();
      *s.log << "step " << n << " | val loss " << fmt(v, 4) << "\n";
      if (s.metrics) s.metrics->write(n, {{"val/loss", v}});
    }
    if (sample_now) {
      const std::string text = sample(t.sample_tokens);  // every rank when collective
      *s.log << "sample at step " << n << ":\n" << text << "\n---\n";
    }
    if (save) s.save();
    if (stop) {
      *s.log << "stopped after step " << n << "; resume with --resume latest\n";
      break;
    }
    since = Clock::now();  // validation, sampling and checkpoints are not the next step's time
  }
  s.finish_pending_save();  // the exit waits for a checkpoint still being written
  s.run_lock.reset();       // the run's files are complete: another run may use out_dir
  if (const std::string end = s.plan.engine->describe_end(); !end.empty())
    *s.log << "end of run, " << end << "\n";  // with transient peaks (ZeRO-3)
  if (s.trace) {
    if (s.ctx) s.ctx->set_observer(nullptr);
    s.trace->write(s.opt.profile_path);
    *s.log << "profile: " << s.opt.profile_path << " (" << s.trace->num_events() << " events)\n";
  }
  return records;
}

}  // namespace loom
