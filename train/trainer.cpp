// train/trainer.cpp — the training loop (see train/trainer.h and Note [Exact resume]).
#include "train/trainer.h"

#include <glob.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/view.h"
#include "core/rng.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "kernels/attention.h"
#include "kernels/copy.h"
#include "kernels/matmul.h"
#include "layers/transformer.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/decay_rule.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "parallel/cp/ring_attention.h"
#include "parallel/dp/data_parallel.h"
#include "parallel/gradients.h"
#include "parallel/launcher.h"
#include "parallel/model_parallel.h"
#include "parallel/parallel_context.h"
#include "parallel/pp/pipeline.h"
#include "train/checkpoint.h"
#include "train/llmc_format.h"
#include "train/metrics.h"
#include "train/profiler.h"
#include "train/readback.h"

namespace loom {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// The config's kernel choices for the calling thread, for a scope: TF32 for f32 GEMMs (Note
// [TF32]) and cuDNN's attention (Note [cuDNN attention]). Held around every step, evaluation
// and sampling. Sampling grows the context one token at a time, and cuDNN would build (and
// keep) a graph for every new length, so sampling keeps Loom's attention kernels.
struct KernelChoices {
  enum class Use { kStep, kSampling };
  kernels::AllowTf32Guard tf32;
  kernels::CudnnAttentionGuard attention;
  explicit KernelChoices(const TrainConfig& t, Use use = Use::kStep)
      : tf32(t.allow_tf32), attention(t.attention_kernel == "cudnn" && use == Use::kStep) {}
};

// A step as train_step() leaves it: its record, still without the numbers the device computed,
// and the read of those numbers (Note [Device step]).
struct PendingStep {
  StepRecord r;
  // [loss, Σ g²] (under loss scaling: of the scaled gradients, then the scale the step used and
  // the loss scaler's state after it)
  Readback::Pending numbers;
  parallel::DpStepStats dp_stats;          // data parallelism: this step's communication
  parallel::pp::PipelineStats pipe_stats;  // pipeline parallelism: this step's schedule
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Shard files matching a glob, sorted; names the key when nothing matches.
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

// train.dtype / train.precision values (validated in train/config.cpp).
DType parse_dtype(const std::string& s) {
  if (s == "f64") return DType::kF64;
  if (s == "bf16") return DType::kBF16;
  if (s == "f16") return DType::kF16;
  return DType::kF32;
}

// train.device → the device this process trains on: the CPU, or the GPU numbered by the
// launcher's node-local rank modulo the GPUs this process sees (a parallel context with NCCL
// communicators overrides it with the GPU it picked: Trainer::State::build).
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

std::string fmt(double v, int precision, bool sci = false) {
  std::ostringstream os;
  if (sci)
    os << std::scientific;
  else
    os << std::fixed;
  os << std::setprecision(precision) << v;
  return os.str();
}

}  // namespace

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

struct Trainer::State {
  Config cfg;
  TrainerOptions opt;
  std::ostream* log;
  std::unique_ptr<Transformer> model;
  Device device;                              // train.device, resolved
  std::unique_ptr<optim::LossScaler> scaler;  // train.loss_scaling (f16 by default)
  Generator dropout_gen{0};
  Generator sample_gen{0};
  std::unique_ptr<optim::Optimizer> optimizer;              // single process
  std::unique_ptr<parallel::DataParallel> dp;               // parallel.dp > 1: owns the optimizer
  std::unique_ptr<parallel::pp::TransformerPipeline> pipe;  // parallel.pp > 1
  std::unique_ptr<parallel::MeshModelParallel> mp;  // parallel.tp or cp > 1 (outlives model)
  std::unique_ptr<parallel::pp::StageUnitHooks> stage_hooks;  // ZeRO-3 under pp: unit → bucket
  parallel::ParallelContext* ctx = nullptr;
  std::unique_ptr<TraceRecorder> trace;  // --profile
  std::ostream discard{nullptr};         // the log of ranks other than 0
  optim::LrSchedule schedule;
  std::unique_ptr<DataLoader> train_loader;
  std::unique_ptr<DataLoader> val_loader;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<MetricsWriter> metrics;
  int64_t step = 0;
  double peak_flops = 0;

  void build();
  void build_parallel(const std::vector<optim::ParamRef>& refs);
  bool is_main() const { return !ctx || ctx->rank() == 0; }
  // Writes this rank's stage's replicated tensors (parameters, ZeRO-0 state) in checkpoints.
  bool is_stage_writer() const { return !ctx || (ctx->dp_rank() == 0 && ctx->cp_rank() == 0); }
  // Tensor/context parallelism (Note [Model-parallel step]).
  int tp_size() const { return ctx ? ctx->tp_size() : 1; }
  int cp_size() const { return ctx ? ctx->cp_size() : 1; }
  Tensor micro_batch_loss(const Batch& b, Generator* gen);
  // The next `count` batches of `loader` as the pipeline takes them: under cp this rank's chunks
  // of each sequence (Note [Model-parallel step]).
  std::pair<std::vector<Tensor>, std::vector<Tensor>> pipeline_batches(DataLoader& loader,
                                                                       int64_t count);
  // The optim.* optimizer over any parameters: the single process's, or the inner optimizer
  // the sharded data-parallel one wraps.
  optim::OptimizerFactory optimizer_factory() const;
  // Σ g² of the whole model on every rank, on the device (Note [Global Σ g²] in
  // parallel/gradients.h): the data-parallel engine's owned pieces, or the trained parameters'.
  Tensor global_sq_sum();
  // Checkpoint names: under parallel.tp > 1 a parameter part and all optimizer state carry
  // "@tp<rank>" (every TP rank holds different values under the same name); replicated
  // parameters are written by TP rank 0 alone.
  std::string tp_suffix() const {
    return tp_size() > 1 ? "@tp" + std::to_string(ctx->tp_rank()) : "";
  }
  // Whether this rank writes the parameter in checkpoints: the one copy counted in sums over
  // ranks (Note [Placement]: not a tied copy, coordinate 0 of every axis it is replicated over).
  bool writes_param(const Tensor& p) const { return parallel::counted_here(p.placement(), ctx); }
  std::string param_key(const std::string& name, bool tp_split) const;
  int64_t micro_batches() const { return pipe ? pipeline_microbatches(cfg) : cfg.optim.grad_accum; }
  // Optimizer state names of the last stage's tied wte copy carry "pp_tied." (Note [Tied
  // embeddings across stages]): the first stage's state has the same names.
  std::string state_name(const std::string& name) const;
  std::vector<std::pair<std::string, Tensor>> trained() const;
  bool zero3() const { return dp && dp->zero_stage() == 3; }  // a forward is collective
  // Whether a forward involves other ranks (ZeRO-3 gathers, tp/cp collectives, pp stages).
  bool collective_forward() const { return zero3() || mp || pipe; }
  std::vector<std::pair<std::string, Tensor>> optimizer_state();
  int64_t optimizer_steps() const { return dp ? dp->step_count() : optimizer->step_count(); }
  void load_initial_weights(const std::string& from);
  void resume(const std::string& which);
  Readback readback;  // the device step's numbers (Note [Device step])
  PendingStep train_step();
  void pipeline_step(PendingStep& pending);  // r.step advanced, as train_step()
  // The end of every step, after the gradients are final: loss (the global batch's, one element)
  // and Σ g² (every rank's parts summed) on the device. Starts reading both and runs the
  // optimizer with the factor computed on the device: clipping, and under loss scaling the
  // unscaling and the skip of an overflowed step (Note [Device step]).
  void finish_step(PendingStep& pending, const Tensor& loss, const Tensor& sq_sum);
  // Completes p's record (waiting for its numbers if they are still on their way) and logs it,
  // timed from `since`, which becomes the moment its numbers reached the host.
  void report(PendingStep& p, Clock::time_point& since);
  // The factor clipping multiplies the gradients by, from their global Σ g² (one element, on the
  // device), left there; undefined when optim.grad_clip is off (Note [Device step]).
  Tensor device_clip_factor(const Tensor& sq_sum) const {
    return cfg.optim.grad_clip > 0
               ? optim::clip_scale_tensor(ops::reshape(sq_sum, {}), cfg.optim.grad_clip)
               : Tensor();
  }
  // dt: the step's seconds; the step's communication and schedule statistics (Note [Device step]).
  void log_step(const PendingStep& p, double dt);
  void save();
};

void Trainer::State::build() {
  const ModelConfig& mc = cfg.model;
  Generator init_gen(cfg.train.seed);
  dropout_gen = Generator(cfg.train.seed + 1);
  sample_gen = Generator(cfg.train.seed + 2);
  device = resolve_device(cfg.train);
  // A context with NCCL communicators has picked this rank's GPU already: train there.
  if (!device.is_cpu() && ctx && !ctx->device().is_cpu()) device = ctx->device();
  set_current_device(device);  // before this rank's first CUDA call (no context on GPU 0)
  // Parameters are built on the device (drawn on the host, so every device starts from the same
  // values); with train.precision ≠ train.dtype the forward casts them (Note [Precision]).
  if (cfg.parallel.tp > 1 || cfg.parallel.cp > 1) {
    LOOM_CONFIG_CHECK(
        ctx != nullptr && ctx->tp_size() == cfg.parallel.tp && ctx->cp_size() == cfg.parallel.cp,
        "parallel.tp: ", cfg.parallel.tp, " × parallel.cp ", cfg.parallel.cp,
        " need a parallel context with those sizes (mpirun -np dp·pp·cp·tp)");
    mp = std::make_unique<parallel::MeshModelParallel>(ctx->tp(), ctx->cp(),
                                                       cfg.parallel.sequence_parallel);
    if (trace) {  // the TP layers' GEMMs beside the communicators' events (--profile)
      mp->set_span_sink([t = trace.get()](const std::string& what, Clock::time_point b,
                                          Clock::time_point e) { t->span("compute", what, b, e); });
    }
  }
  model = std::make_unique<Transformer>(mc, parse_dtype(cfg.train.dtype), device, mp.get());
  // The TP layers placed their parts; every other parameter is whole on each TP rank.
  if (mp) parallel::mark_replicated(model->parameters(), parallel::kAxisTp);
  if (cfg.train.precision != cfg.train.dtype)
    model->set_compute_dtype(parse_dtype(cfg.train.precision));
  if (cfg.train.loss_scaling == "dynamic" ||
      (cfg.train.loss_scaling == "auto" && cfg.train.precision == "f16")) {
    scaler = std::make_unique<optim::LossScaler>(cfg.train.initial_loss_scale);
    scaler->to(device);  // decided there (Note [Device step])
  }
  model->init_weights(init_gen);
  if (cfg.parallel.dp > 1 &&
      ctx != nullptr) {  // dropout draws the single-process batch's masks for this replica's rows
    model->set_batch_slice(
        {ctx->dp_rank() * cfg.data.batch_size, cfg.parallel.dp * cfg.data.batch_size});
  }
  if (!cfg.train.init_from.empty()) load_initial_weights(cfg.train.init_from);

  int64_t released = 0;
  if (cfg.parallel.pp > 1) {
    LOOM_CONFIG_CHECK(
        ctx != nullptr && ctx->pp_size() == cfg.parallel.pp, "parallel.pp: ", cfg.parallel.pp,
        " stages need a parallel context with pp = ", cfg.parallel.pp, " (mpirun -np dp·pp)");
    parallel::pp::PipelineOptions po;
    po.schedule = parallel::pp::parse_schedule(cfg.parallel.schedule);
    po.vpp = static_cast<int>(cfg.parallel.vpp);
    po.microbatches = static_cast<int>(pipeline_microbatches(cfg));
    po.layout = cfg.parallel.pp_layout;
    // Under tp/cp each micro-batch is this cp rank's chunks (Note [Model-parallel step]).
    const int64_t local_seq = cfg.data.seq_len / cfg.parallel.cp;
    // Note [Pipeline dropout]: the single-process micro-batch (dp replicas' rows together).
    po.dropout_numel = cfg.data.batch_size * cfg.parallel.dp * cfg.data.seq_len * mc.n_embd;
    if (mp) {
      po.positions =
          parallel::cp::cp_positions(cfg.data.seq_len, ctx->cp_rank(), ctx->cp_size()).to(device);
      po.activation_rows = cfg.parallel.sequence_parallel ? local_seq / cfg.parallel.tp : local_seq;
      po.loss_scale = static_cast<double>(cfg.parallel.cp);
    }
    pipe = std::make_unique<parallel::pp::TransformerPipeline>(*model, ctx->pp(), po,
                                                               cfg.data.batch_size, local_seq);
    released = pipe->release_other_stages(*model);
  }
  const optim::DecayRule rule = optim::parse_decay_rule(cfg.optim.decay_rule);
  const std::vector<optim::ParamRef> refs = optim::make_param_refs(trained(), rule);
  const OptimConfig& o = cfg.optim;
  if (cfg.parallel.dp > 1 || cfg.parallel.cp > 1) {
    build_parallel(refs);
  } else {
    optimizer = optimizer_factory()(refs);
  }
  schedule = {o.schedule, o.lr, o.min_lr, o.warmup_steps, cfg.train.steps, o.decay_fraction};

  const DataConfig& d = cfg.data;
  const int dp_rank = dp ? ctx->dp_rank() : 0, dp_size = dp ? ctx->dp_size() : 1;
  train_loader = std::make_unique<DataLoader>(expand_shards(d.train, "data.train"), d.batch_size,
                                              d.seq_len, dp_rank, dp_size, d.seed);
  if (!d.val.empty()) {
    val_loader = std::make_unique<DataLoader>(expand_shards(d.val, "data.val"), d.batch_size,
                                              d.seq_len, 0, 1, d.seed);
  }
  fs::create_directories(cfg.train.out_dir);
  if (is_main()) {
    // The effective config (every key, defaults included) beside the run's checkpoints and
    // metrics; printed in full only with --print-config, so the first screen shows training.
    const fs::path path = fs::path(cfg.train.out_dir) / "config.yaml";
    std::ofstream out(path);
    out << config_to_yaml(cfg);
    if (!out.flush())
      throw std::runtime_error("cannot write the effective config to " + path.string());
    *log << "effective config: " << path.string() << " (--print-config prints it)\n";
  }
  if (is_main() && (cfg.logging.jsonl || cfg.logging.tensorboard)) {
    metrics = std::make_unique<MetricsWriter>(cfg.train.out_dir, cfg.logging.jsonl,
                                              cfg.logging.tensorboard);
  }
  if (cfg.train.peak_flops > 0) {
    peak_flops = cfg.train.peak_flops;
  } else {
    kernels::AllowTf32Guard tf32(cfg.train.allow_tf32);
    peak_flops = measure_gemm_flops(device, parse_dtype(cfg.train.precision));
  }
  *log << "model: " << mc.arch << ", " << model->num_parameters(true) << " parameters ("
       << model->num_parameters() << " with vocab padding) on " << device.str() << ", "
       << cfg.train.precision << " compute; peak " << fmt(peak_flops / 1e9, 1) << " GFLOP/s ("
       << (cfg.train.peak_flops > 0 ? "config" : "measured " + cfg.train.precision + " GEMM")
       << ")";
  // Which OpenBLAS kernel set the CPU GEMMs (and so the peak above) ran on.
  if (device.is_cpu()) *log << "; OpenBLAS " << kernels::cpu_blas_core() << " kernels";
  *log << "\n";
  if (dp) *log << dp->describe() << "\n";
  if (pipe) {
    *log << pipe->describe() << "; " << released << " parameters of other stages released\n";
  }
  if (mp) {
    *log << "model parallel: tp " << tp_size()
         << (cfg.parallel.sequence_parallel ? " (sequence parallel)" : "") << ", cp " << cp_size()
         << "\n";
  }
}

std::vector<std::pair<std::string, Tensor>> Trainer::State::trained() const {
  return pipe ? pipe->named_parameters() : model->named_parameters();
}

std::string Trainer::State::state_name(const std::string& name) const {
  // "<state kind>.<parameter>" or, at ZeRO-1, "<state kind>.<parameter>[begin:end]".
  const size_t dot = name.find('.');
  if (!pipe || dot == std::string::npos) return name;
  const std::string param = name.substr(dot + 1);
  return pipe->is_tied_copy(param.substr(0, param.find('['))) ? "pp_tied." + name : name;
}

void Trainer::State::build_parallel(const std::vector<optim::ParamRef>& refs) {
  const int world = ctx ? ctx->world_size() : 1;
  const ParallelConfig& pc = cfg.parallel;
  const int64_t ranks = pc.dp * pc.pp * pc.cp * pc.tp;
  if (world != ranks) {
    throw ConfigError("parallel.dp: " + std::to_string(pc.dp) + " × pp " + std::to_string(pc.pp) +
                      " × cp " + std::to_string(pc.cp) + " × tp " + std::to_string(pc.tp) +
                      " does not match the world size " + std::to_string(world) +
                      " (start with mpirun -np " + std::to_string(ranks) + ")");
  }
  parallel::DataParallelConfig c;
  c.zero_stage = static_cast<int>(cfg.parallel.zero_stage);
  c.bucket_bytes = static_cast<size_t>(cfg.parallel.bucket_mb * (1 << 20));
  c.overlap = cfg.parallel.overlap;
  c.optimizer = optimizer_factory();
  c.decay_rule = optim::parse_decay_rule(cfg.optim.decay_rule);
  c.axes = {parallel::kAxisDp, parallel::kAxisCp};
  parallel::MicsGroups mics;
  if (cfg.parallel.mics_partition_size > 0) {
    mics = {&ctx->group({parallel::kAxisMicsPartition}), &ctx->group({parallel::kAxisMicsReplica})};
  }
  // Under context parallelism each cp rank holds part of the same samples' gradients: they are
  // reduced over dp and cp together (Note [Model-parallel step]).
  parallel::Communicator& group = ctx->group({parallel::kAxisDp, parallel::kAxisCp});
  if (pipe && c.zero_stage >= 2) {  // this stage's units (Note [Sharded stages] in parallel/pp)
    parallel::pp::TransformerPipeline::StageUnits units = pipe->parameter_units();
    dp = std::make_unique<parallel::DataParallel>(units.units, group, c, mics);
    if (c.zero_stage == 3) {
      stage_hooks = std::make_unique<parallel::pp::StageUnitHooks>(*dp, std::move(units.buckets));
      model->set_unit_hooks(stage_hooks.get());
    }
    return;
  }
  if (c.zero_stage == 3) {  // parameters gathered per unit (Note [ZeRO-3] in parallel/dp)
    dp = std::make_unique<parallel::DataParallel>(model->parameter_units(), group, c, mics);
    model->set_unit_hooks(dp.get());
    return;
  }
  std::vector<std::pair<std::string, Tensor>> named;
  for (const optim::ParamRef& r : refs) named.emplace_back(r.name, r.param);
  dp = std::make_unique<parallel::DataParallel>(named, group, c, mics);
}

// Note [Model-parallel step]: under parallel.tp/cp every rank of a data-parallel replica reads
// the same batch; cp rank r keeps its two load-balanced chunks of each sequence with their
// global positions (parallel/cp). The model's loss is this rank's share (the cp group's shares
// sum to the replica's mean, Note [Context-parallel loss]); data parallelism averages gradients
// over dp·cp ranks, so the loss is multiplied by cp for backward, which makes that average the
// sum over cp of the replicas' mean. TP ranks hold the same loss; the gradient norm is the one
// of every layout (Note [Global Σ g²] in parallel/gradients.h).

optim::OptimizerFactory Trainer::State::optimizer_factory() const {
  const OptimConfig o = cfg.optim;
  if (o.name == "sgd") {
    return [o](std::vector<optim::ParamRef> refs) -> std::unique_ptr<optim::Optimizer> {
      return std::make_unique<optim::SGD>(std::move(refs), o.momentum, o.weight_decay);
    };
  }
  return [o](std::vector<optim::ParamRef> refs) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(std::move(refs), o.beta1, o.beta2, o.eps, o.weight_decay);
  };
}

Tensor Trainer::State::global_sq_sum() {
  std::vector<Tensor> params;
  for (const auto& [name, p] : trained()) params.push_back(p);
  return parallel::global_grad_sq_sum(
      dp ? dp->grad_pieces() : parallel::parameter_grad_pieces(params), ctx, device);
}

Tensor Trainer::State::micro_batch_loss(const Batch& b, Generator* gen) {
  if (!mp) return model->loss(b.inputs, b.targets, gen);
  const int r = ctx->cp_rank(), n = ctx->cp_size();
  return model->loss(parallel::cp::shard_sequence(b.inputs, 1, r, n),
                     parallel::cp::shard_sequence(b.targets, 1, r, n),
                     parallel::cp::cp_positions(b.inputs.size(1), r, n), gen);
}

std::pair<std::vector<Tensor>, std::vector<Tensor>> Trainer::State::pipeline_batches(
    DataLoader& loader, int64_t count) {
  std::vector<Tensor> inputs, targets;
  const int r = ctx->cp_rank(), n = ctx->cp_size();
  for (int64_t i = 0; i < count; ++i) {
    Batch b = loader.next();
    inputs.push_back(n > 1 ? parallel::cp::shard_sequence(b.inputs, 1, r, n) : b.inputs);
    targets.push_back(n > 1 ? parallel::cp::shard_sequence(b.targets, 1, r, n) : b.targets);
  }
  return {std::move(inputs), std::move(targets)};
}

// ZeRO-3 shard names ("<param>[b:e]") differ across TP ranks too: all carry the suffix.
std::string Trainer::State::param_key(const std::string& name, bool tp_split) const {
  return tp_split || (zero3() && tp_size() > 1) ? name + tp_suffix() : name;
}

std::vector<std::pair<std::string, Tensor>> Trainer::State::optimizer_state() {
  if (!dp) return optimizer->state_tensors();
  // ZeRO-0 state is replicated: rank 0 writes it; sharded state is written by its owner.
  if (dp->zero_stage() == 0 && !is_stage_writer()) return {};
  return dp->state_tensors();
}

void Trainer::State::load_initial_weights(const std::string& from) {
  if (fs::is_directory(from)) {
    CheckpointContents c = load_checkpoint(from);
    int64_t loaded = 0;
    for (auto& [name, t] : c.tensors) {
      if (name.rfind("model.", 0) != 0) continue;
      const size_t bracket = name.find('[');
      if (bracket != std::string::npos) {  // a ZeRO-3 shard "model.<param>[<begin>:<end>]"
        Tensor p = model->parameter(name.substr(6, bracket - 6));
        const int64_t begin = std::stoll(name.substr(bracket + 1));
        const int64_t end = std::stoll(name.substr(name.find(':', bracket) + 1));
        LOOM_CHECK(begin >= 0 && end <= p.numel() && t.numel() == end - begin, from, ": ", name,
                   " does not fit the model's ", shape_str(p.shape()));
        Tensor dst = p.detach().view({p.numel()}).narrow(0, begin, end - begin);
        ops::copy_(dst, t);
        ++loaded;
        continue;
      }
      Tensor p = model->parameter(name.substr(6));
      LOOM_CHECK(p.shape() == t.shape(), from, ": ", name, " has shape ", shape_str(t.shape()),
                 " but the model expects ", shape_str(p.shape()));
      ops::copy_(p, t.to(p.device()));
      ++loaded;
    }
    *log << "init_from: " << loaded << " tensors from checkpoint " << from << "\n";
  } else {
    load_llmc_model(from, *model);
    *log << "init_from: llm.c model file " << from << "\n";
  }
}

void Trainer::State::resume(const std::string& which) {
  const std::string root = (fs::path(cfg.train.out_dir) / "checkpoints").string();
  const std::string dir = which == "latest" ? latest_checkpoint(root) : which;
  LOOM_CHECK(!dir.empty(), "--resume latest: no checkpoint under ", root);
  CheckpointContents c = load_checkpoint(dir);
  std::map<std::string, Tensor> by_name(c.tensors.begin(), c.tensors.end());
  auto restore = [&](const std::string& name, Tensor& into) {
    auto it = by_name.find(name);
    LOOM_CHECK(it != by_name.end(), dir, ": checkpoint has no tensor '", name, "'");
    LOOM_CHECK(it->second.shape() == into.shape(), dir, ": '", name, "' has shape ",
               shape_str(it->second.shape()), " but the run expects ", shape_str(into.shape()));
    ops::copy_(into, it->second.to(into.device()));
  };
  // ZeRO-3: each rank restores the parameter pieces it owns (saved by the same layout).
  for (auto& [name, p] : zero3() ? dp->parameter_shards() : trained())
    restore("model." + param_key(name, p.placement().split_over(parallel::kAxisTp) != nullptr), p);
  for (auto& [name, t] : dp ? dp->state_tensors() : optimizer->state_tensors()) {
    restore("optim." + state_name(name) + tp_suffix(), t);
  }
  auto num = [&](const std::string& key) {
    auto it = c.state.find(key);
    LOOM_CHECK(it != c.state.end(), dir, ": checkpoint state has no '", key, "'");
    return std::stoull(it->second);
  };
  if (dp)
    dp->set_step_count(static_cast<int64_t>(num("optim.step_count")));
  else
    optimizer->set_step_count(static_cast<int64_t>(num("optim.step_count")));
  train_loader->set_state(
      {static_cast<int64_t>(num("loader.epoch")), static_cast<int64_t>(num("loader.position"))});
  dropout_gen.set_state({num("rng.dropout.seed"), num("rng.dropout.offset")});
  sample_gen.set_state({num("rng.sample.seed"), num("rng.sample.offset")});
  if (scaler) {
    auto real = [&](const std::string& key) {
      auto it = c.state.find(key);
      LOOM_CHECK(it != c.state.end(), dir, ": checkpoint state has no '", key,
                 "' (saved by a run without f16)");
      return std::stod(it->second);
    };
    scaler->set_state({real("loss_scale.scale"), static_cast<int64_t>(num("loss_scale.good_steps")),
                       static_cast<int64_t>(num("loss_scale.skipped_steps"))});
  }
  step = c.step;
  *log << "resumed from " << dir << " at step " << step << "\n";
}

// Note [Device step]: a step — one process, or any layout of data, tensor, context and pipeline
// parallelism, any ZeRO stage, with or without loss scaling — never waits for the device. The
// micro-batch losses are summed and the gradients' squares are summed where they lie (data
// parallelism: the loss averaged and Σ g² reduced over the ranks by the communicators, on the
// device too); the factor the update multiplies the gradients by is computed there — the
// clipping factor (clip_scale_tensor), or under dynamic loss scaling the unscale-and-clip factor
// with the scale's update (optim::LossScaler::step_factor, Note [Loss scaling across ranks]) —
// and AdamW's multi-tensor update applies it as it reads the gradients (AdamWOptions::grad_scale),
// skipping an overflowed step on the device with its step count there (AdamWOptions::step_count).
// The numbers the log needs (loss, Σ g², and under loss scaling the scale used and the scaler's
// new state) are copied into pinned host memory behind the step's work (train/readback.h) and
// read when the step is reported: Trainer::run() reports step N after it has launched step
// N + 1, so the host prepares the next step while the device finishes this one. A step after
// which something reads the model (validation, sampling, a checkpoint, the end or a stop) is
// reported at once, so the host's copy of the scaler's state is current whenever a checkpoint
// is written. The step's time is the interval between the moments its numbers and its
// predecessor's reached the host. Batches reach the device by asynchronous uploads, their ids
// checked on the host (Note [Host ids] in layers/transformer.cpp).
PendingStep Trainer::State::train_step() {
  PendingStep pending;
  StepRecord& r = pending.r;
  r.lr = schedule.lr_at(step);
  if (dp)
    dp->zero_grad();
  else
    optimizer->zero_grad();
  KernelChoices kernel_choices(cfg.train);
  if (pipe) {
    pipeline_step(pending);
    if (dp) pending.dp_stats = dp->last_step_stats();
    pending.pipe_stats = pipe->last_stats();
    return pending;
  }
  const int64_t accum = cfg.optim.grad_accum;
  Tensor loss_sum;  // Σ micro-batch losses, f64, on the device
  for (int64_t m = 0; m < accum; ++m) {
    Batch b = train_loader->next();
    if (dp) dp->set_sync(m == accum - 1);  // reduce once per step, after the last micro-batch
    const auto t_fwd = Clock::now();
    Tensor loss = micro_batch_loss(b, &dropout_gen);
    if (accum > 1) loss = ops::scale(loss, 1.0 / static_cast<double>(accum));
    const auto t_bwd = Clock::now();
    // × cp: data parallelism averages over dp·cp ranks (Note [Model-parallel step]).
    const Tensor seed = cp_size() > 1 ? ops::scale(loss, static_cast<double>(cp_size())) : loss;
    autograd::backward(scaler ? scaler->scale_loss(seed) : seed);
    if (trace) {
      trace->span("compute", "forward", t_fwd, t_bwd);
      trace->span("compute", "backward", t_bwd, Clock::now());
    }
    const Tensor l = ops::to_dtype(loss.detach(), DType::kF64);
    loss_sum = loss_sum.defined() ? ops::add(loss_sum, l) : l;
  }
  const auto t_sync = Clock::now();
  if (dp) dp->finish_gradient_sync();
  Tensor loss = ops::reshape(loss_sum, {1});  // the global batch's loss, on the device
  if (dp) {
    if (cp_size() > 1) ctx->cp().all_reduce(loss, parallel::ReduceOp::kSum);  // shares
    ctx->dp().all_reduce(loss, parallel::ReduceOp::kAvg);
  }
  const Tensor sq_sum = global_sq_sum();
  const auto t_opt = Clock::now();
  finish_step(pending, loss, sq_sum);
  if (trace && dp) {
    trace->span("compute", "wait for gradient sync", t_sync, t_opt);
    trace->span("compute", "clip + optimizer + parameter gather", t_opt, Clock::now());
  } else if (trace) {
    trace->span("compute", "clip + optimizer", t_sync, Clock::now());
  }
  r.step = ++step;
  if (dp) pending.dp_stats = dp->last_step_stats();
  return pending;
}

// Note [Loss scaling across ranks]: under dynamic loss scaling (train.loss_scaling) every rank
// holds the same Σ g² of the scaled gradients (reduced over the data-parallel shards, the TP
// parts and the pipeline stages before finish_step) and the same scaler state, so every rank's
// device takes the same decision (optim::LossScaler::step_factor): a finite norm gives the
// factor 1/scale (a power of two: exact) times the clipping factor of the unscaled norm; inf/NaN
// gives NaN, which skips the optimizer step on every rank without counting it, and halves the
// scale. One process is the case of one rank. The host learns the outcome when it reports the
// step (the scale used, the new state), as it learns the loss.
void Trainer::State::finish_step(PendingStep& pending, const Tensor& loss, const Tensor& sq_sum) {
  StepRecord& r = pending.r;
  std::vector<Tensor> numbers = {ops::reshape(loss, {1}), ops::reshape(sq_sum, {1})};
  Tensor factor;
  if (scaler) {  // Note [Loss scaling across ranks]
    numbers.push_back(ops::reshape(ops::clone(scaler->device_scale()), {1}));  // before the update
    factor = scaler->step_factor(sq_sum, cfg.optim.grad_clip);
    numbers.push_back(scaler->device_state());
  } else {
    factor = device_clip_factor(sq_sum);
  }
  pending.numbers = readback.start(ops::cat(numbers, 0));  // Note [Device step]
  if (dp)
    dp->step_scaled(r.lr, factor);
  else
    optimizer->step_scaled(r.lr, factor);
}

void Trainer::State::report(PendingStep& p, Clock::time_point& since) {
  const std::vector<double>& v = p.numbers.get();
  p.r.loss = v[0];
  p.r.grad_norm = std::sqrt(v[1]);
  if (scaler) {  // the norm of the unscaled gradients; an overflow's is left as it is
    p.r.skipped = !std::isfinite(p.r.grad_norm);
    if (!p.r.skipped) p.r.grad_norm /= v[2];
    scaler->mirror({v[3], v[4], v[5]});
  }
  const Clock::time_point ready = p.numbers.ready_at();
  log_step(p, std::chrono::duration<double>(ready - since).count());
  since = ready;
}

// One step of the pipeline (parallel.pp > 1): the same global batch, loss scaling and clipping
// as train_step(), with the gradient norm summed over the stages (Note [Tied embeddings across
// stages] in parallel/pp/partition.h).
void Trainer::State::pipeline_step(PendingStep& pending) {
  StepRecord& r = pending.r;
  const auto [inputs, targets] = pipeline_batches(*train_loader, micro_batches());
  const auto t0 = Clock::now();
  Tensor loss = ops::reshape(pipe->forward_backward(
                                 inputs, targets, &dropout_gen,
                                 [this](bool last) {
                                   if (dp) dp->set_sync(last);
                                 },
                                 scaler ? scaler->device_scale() : Tensor()),
                             {1});
  if (cp_size() > 1) {  // this cp rank's share (the loss carried the ×cp), summed over cp
    loss = ops::div(loss,
                    Tensor::full({1}, static_cast<double>(cp_size()), DType::kF64, loss.device()));
    ctx->cp().all_reduce(loss, parallel::ReduceOp::kSum);
  }
  const auto t_sync = Clock::now();
  if (dp) dp->finish_gradient_sync();
  if (dp && dp->zero_stage() >= 2)  // sharded gradients (Note [Sharded stages] in parallel/pp)
    pipe->sync_tied_gradient_pieces(dp->owned_grad_pieces());
  else
    pipe->sync_tied_gradients();
  const Tensor sq = global_sq_sum();  // Σ g² over every stage, on the device
  if (dp) ctx->dp().all_reduce(loss, parallel::ReduceOp::kAvg);  // the global batch's loss
  finish_step(pending, loss, sq);
  if (trace) {
    trace->span("compute", "pipeline forward + backward", t0, t_sync);
    trace->span("compute", "sync + clip + optimizer", t_sync, Clock::now());
  }
  r.step = ++step;
}

void Trainer::State::log_step(const PendingStep& p, double dt) {
  const StepRecord& r = p.r;
  const parallel::DpStepStats& dp_stats = p.dp_stats;
  // Note [Throughput]: tok/s is the whole job's — the tokens of one global batch (every dp
  // replica's micro-batches; a sequence counted once however cp, tp or pp split it) per second
  // of step time — and MFU is those tokens' model FLOPs over the peak of every rank in the job
  // (world size × the per-rank peak). One definition for every layout; with even work it equals
  // each rank's own MFU.
  const double replicas = ctx ? static_cast<double>(ctx->dp_size()) : 1.0;
  const double ranks = ctx ? static_cast<double>(ctx->world_size()) : 1.0;
  const double tokens =
      static_cast<double>(cfg.data.batch_size * cfg.data.seq_len * micro_batches()) * replicas;
  const double mfu = model->flops_per_token(cfg.data.seq_len) * tokens / dt / (peak_flops * ranks);
  const AllocatorStats mem = allocator_for(device.type).stats();
  if (r.step % cfg.train.log_every == 0 || r.step == cfg.train.steps) {
    *log << "step " << r.step << "/" << cfg.train.steps << " | loss " << fmt(r.loss, 4) << " | lr "
         << fmt(r.lr, 2, true) << " | norm " << fmt(r.grad_norm, 3) << " | " << fmt(dt * 1e3, 1)
         << " ms | " << fmt(tokens / dt, 0) << " tok/s | MFU " << fmt(100 * mfu, 1) << "% | peak "
         << fmt(static_cast<double>(mem.peak_bytes) / (1 << 20), 1) << " MiB";
    if (scaler)
      *log << " | loss scale " << scaler->scale() << (r.skipped ? " (overflow: step skipped)" : "");
    if (dp) {
      *log << " | comm exposed " << fmt(dp_stats.exposed_wait_s * 1e3, 1)
           << " ms, launched in backward " << fmt(100 * dp_stats.overlap_fraction(), 0) << "%";
    }
    if (pipe) {
      *log << " | pipeline idle " << fmt(100 * p.pipe_stats.idle_fraction(), 0) << "% (rank "
           << ctx->rank() << ")";
    }
    *log << "\n";
    log->flush();
  }
  if (metrics) {
    metrics->write(r.step, {{"train/loss", r.loss},
                            {"train/lr", r.lr},
                            {"train/grad_norm", r.grad_norm},
                            {"perf/ms_per_step", dt * 1e3},
                            {"perf/tokens_per_s", tokens / dt},
                            {"perf/mfu", mfu},
                            {"mem/peak_bytes", static_cast<double>(mem.peak_bytes)}});
    if (scaler)
      metrics->write(r.step, {{"train/loss_scale", scaler->scale()},
                              {"train/skipped", r.skipped ? 1.0 : 0.0}});
    if (dp) {
      metrics->write(r.step, {{"comm/exposed_s", dp_stats.exposed_wait_s},
                              {"comm/overlap_fraction", dp_stats.overlap_fraction()}});
    }
  }
}

void Trainer::State::save() {
  CheckpointContents c;
  c.step = step;
  c.config_yaml = config_to_yaml(cfg);
  if (zero3()) {  // each rank holds only its shard: "model.<param>[<begin>:<end>]"
    for (auto& [name, p] : dp->parameter_shards()) {
      // The last stage's tied copy has the first stage's names and values (Note [Sharded stages]).
      if (pipe && pipe->is_tied_copy(name.substr(0, name.find('[')))) continue;
      c.tensors.emplace_back("model." + param_key(name, false), p);
    }
  } else {  // one copy of each: Note [Placement] (replicas, TP-replicated and tied copies skip)
    for (auto& [name, p] : trained()) {
      if (writes_param(p))
        c.tensors.emplace_back(
            "model." + param_key(name, p.placement().split_over(parallel::kAxisTp) != nullptr), p);
    }
  }
  for (auto& [name, t] : optimizer_state())
    c.tensors.emplace_back("optim." + state_name(name) + tp_suffix(), t);
  const LoaderState ls = train_loader->state();
  c.state = {{"optim.step_count", std::to_string(optimizer_steps())},
             {"loader.epoch", std::to_string(ls.epoch)},
             {"loader.position", std::to_string(ls.position)},
             {"rng.dropout.seed", std::to_string(dropout_gen.state().seed)},
             {"rng.dropout.offset", std::to_string(dropout_gen.state().offset)},
             {"rng.sample.seed", std::to_string(sample_gen.state().seed)},
             {"rng.sample.offset", std::to_string(sample_gen.state().offset)}};
  if (scaler) {
    const optim::LossScalerState ls_state = scaler->state();
    std::ostringstream scale;
    scale << std::setprecision(17) << ls_state.scale;  // exact (a power of two)
    c.state["loss_scale.scale"] = scale.str();
    c.state["loss_scale.good_steps"] = std::to_string(ls_state.good_steps);
    c.state["loss_scale.skipped_steps"] = std::to_string(ls_state.skipped_steps);
  }
  const auto t0 = Clock::now();
  const std::string dir = save_checkpoint((fs::path(cfg.train.out_dir) / "checkpoints").string(), c,
                                          cfg.checkpoint.keep, ctx ? &ctx->world() : nullptr);
  *log << "checkpoint: " << dir << " (" << fmt(seconds_since(t0), 2) << " s)\n";
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
}

Trainer::~Trainer() = default;

int64_t Trainer::step() const { return s_->step; }

std::string Trainer::checkpoint_root() const {
  return (fs::path(s_->cfg.train.out_dir) / "checkpoints").string();
}

std::vector<std::pair<std::string, Tensor>> Trainer::parameters() const {
  return s_->zero3() ? s_->dp->full_parameters() : s_->model->named_parameters();
}

std::vector<std::pair<std::string, Tensor>> Trainer::trained_parameters() const {
  return s_->trained();
}

std::vector<StepRecord> Trainer::run() {
  State& s = *s_;
  const TrainConfig& t = s.cfg.train;
  std::vector<StepRecord> records;
  Clock::time_point since = Clock::now();  // the start of the interval the next report times
  auto report = [&](PendingStep& p) {
    s.report(p, since);
    records.push_back(p.r);
  };
  std::optional<PendingStep> prev;  // launched, reported once its successor is launched
  while (s.step < t.steps) {
    PendingStep p = s.train_step();
    if (prev) {  // the device is busy with p while the host waits for prev's numbers
      report(*prev);
      prev.reset();
    }
    const int64_t n = p.r.step;
    const bool validate = s.val_loader && t.val_every > 0 && (n % t.val_every == 0 || n == t.steps);
    const bool sample_now = (s.is_main() || s.collective_forward()) && t.sample_every > 0 &&
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
    report(p);
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
  if (s.dp) *s.log << "end of run, " << s.dp->describe() << "\n";  // with transient peaks (ZeRO-3)
  if (s.trace) {
    if (s.ctx) s.ctx->set_observer(nullptr);
    s.trace->write(s.opt.profile_path);
    *s.log << "profile: " << s.opt.profile_path << " (" << s.trace->num_events() << " events)\n";
  }
  return records;
}

double Trainer::evaluate() {
  State& s = *s_;
  LOOM_CHECK(s.val_loader != nullptr, "evaluate: no validation data (data.val is empty)");
  autograd::NoGradGuard no_grad;
  KernelChoices kernel_choices(s.cfg.train);
  s.model->eval();
  s.val_loader->set_state({0, 0});
  // The mean over the val batches; under cp this rank's share of it.
  double mean = 0;
  if (s.pipe) {  // a forward-only pass through the stages (Note [Pipeline evaluation])
    const auto [inputs, targets] = s.pipeline_batches(*s.val_loader, s.cfg.train.val_steps);
    mean = s.pipe->evaluate(inputs, targets);
  } else {
    for (int64_t i = 0; i < s.cfg.train.val_steps; ++i) {
      Batch b = s.val_loader->next();
      mean += s.micro_batch_loss(b, nullptr).item();
    }
    mean /= static_cast<double>(s.cfg.train.val_steps);
  }
  if (s.cp_size() > 1) {  // the shares sum to each batch's mean (Note [Context-parallel loss])
    Tensor t = Tensor::full({1}, mean, DType::kF64);
    s.ctx->cp().all_reduce(t, parallel::ReduceOp::kSum);
    mean = t.item();
  }
  s.model->train();
  return mean;
}

// Note [Sampling across ranks]: under tp/cp/pp a forward is collective and its logits are
// spread out, so every rank runs the same sampling loop on the same replicated logits row and
// draws the same token from its own copy of the sampling generator (all copies advance alike).
// The context is padded on the right to a multiple of 2·cp (and of tp under sequence
// parallelism) with end-of-text tokens: attention is causal, so positions after the last real
// token change nothing before it. Each cp rank runs its load-balanced chunks (parallel/cp); the
// rank holding the last real position contributes its row, the others zeros (a cp all-reduce);
// the vocabulary parts are all-gathered over tp; under pp the last stage's row is broadcast.
std::vector<double> Trainer::next_token_logits(const std::vector<int32_t>& context) {
  State& s = *s_;
  const ModelConfig& mc = s.cfg.model;
  autograd::NoGradGuard no_grad;
  KernelChoices kernel_choices(s.cfg.train, KernelChoices::Use::kSampling);
  const bool was_training = s.model->training();
  s.model->eval();
  const int cp = s.cp_size(), tp = s.tp_size();
  const int64_t multiple = (cp > 1 ? 2 * cp : 1) * (s.cfg.parallel.sequence_parallel ? tp : 1);
  const int64_t window = mc.max_seq_len / multiple * multiple;
  LOOM_CHECK(!context.empty() && window > 0,
             "next_token_logits: empty context, or model.max_seq_len ", mc.max_seq_len,
             " is below the layout's sequence multiple ", multiple);
  const int64_t len = std::min<int64_t>(static_cast<int64_t>(context.size()), window);
  const int64_t padded = (len + multiple - 1) / multiple * multiple;
  std::vector<int32_t> ids(context.end() - len, context.end());
  ids.resize(static_cast<size_t>(padded),
             static_cast<int32_t>(std::min<int64_t>(mc.vocab_size - 1, 50256)));
  Tensor input = Tensor::from_vector(ids, {1, padded});
  Tensor pos = s.model->positions(padded).to(Device::cpu());
  if (cp > 1) {
    const int r = s.ctx->cp_rank();
    input = parallel::cp::shard_sequence(input, 1, r, cp);
    pos = parallel::cp::cp_positions(padded, r, cp);
  }
  // (1, rows, Vp/tp) on the ranks holding the head (every rank without pp).
  Tensor logits;
  if (s.pipe) {
    const int64_t rows = input.size(1) / (s.cfg.parallel.sequence_parallel ? tp : 1);
    logits = s.pipe->forward_only(input.to(s.device), pos.to(s.device), rows,
                                  [&](const Tensor& x) { return s.model->head_logits(x); });
  } else {
    logits = s.model->forward(input.to(s.device), pos.to(s.device), nullptr);
  }
  // The row travels on the model's device (the communicators may be NCCL's).
  const int64_t vp = mc.padded_vocab();
  Tensor row = Tensor::zeros({vp / tp}, DType::kF64, s.device);
  if (logits.defined()) {
    const std::vector<double> p = pos.to(Device::cpu()).to_vector();
    for (size_t j = 0; j < p.size(); ++j) {
      if (static_cast<int64_t>(p[j]) != len - 1) continue;
      row = ops::contiguous(ops::to_dtype(
          logits.narrow(1, static_cast<int64_t>(j), 1).reshape({vp / tp}), DType::kF64));
    }
    if (tp > 1) {  // the vocabulary parts, in rank order
      Tensor all = Tensor::empty({vp}, DType::kF64, s.device);
      s.ctx->tp().all_gather(row, all);
      row = all;
    }
    if (cp > 1) s.ctx->cp().all_reduce(row, parallel::ReduceOp::kSum);  // one rank holds it
  }
  if (s.pipe) {
    if (!logits.defined()) row = Tensor::empty({vp}, DType::kF64, s.device);
    s.ctx->pp().broadcast(row, s.pipe->last_stage_rank());
  }
  if (was_training) s.model->train();
  std::vector<double> out = row.to(Device::cpu()).to_vector();
  out.resize(static_cast<size_t>(mc.vocab_size));
  return out;
}

std::string Trainer::sample(int64_t n) {
  State& s = *s_;
  if (!s.tokenizer) s.tokenizer = std::make_unique<Tokenizer>(find_bpe_dir());
  // <|endoftext|> starts the text; a model with a smaller vocabulary (tests) starts from id 0.
  const int32_t eot = s.tokenizer->eot_id();
  std::vector<int32_t> ids = {eot < s.cfg.model.vocab_size ? eot : 0};
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<double> row = next_token_logits(ids);
    // Temperature, then keep the top-k logits, then sample from the softmax of what is left.
    std::vector<std::pair<double, int32_t>> cand;
    for (size_t v = 0; v < row.size(); ++v)
      cand.emplace_back(row[v] / s.cfg.train.temperature, static_cast<int32_t>(v));
    const size_t k = s.cfg.train.top_k > 0
                         ? std::min<size_t>(cand.size(), static_cast<size_t>(s.cfg.train.top_k))
                         : cand.size();
    std::partial_sort(cand.begin(), cand.begin() + static_cast<int64_t>(k), cand.end(),
                      std::greater<>());
    double z = 0;
    for (size_t j = 0; j < k; ++j) z += std::exp(cand[j].first - cand[0].first);
    double u = rand({1}, s.sample_gen, DType::kF64).item() * z;
    size_t pick = k - 1;
    for (size_t j = 0; j < k; ++j) {
      u -= std::exp(cand[j].first - cand[0].first);
      if (u <= 0) {
        pick = j;
        break;
      }
    }
    ids.push_back(cand[pick].second);
  }
  return s.tokenizer->decode(std::span<const int32_t>(ids.data() + 1, ids.size() - 1));
}

}  // namespace loom
