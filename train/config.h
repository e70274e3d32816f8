// train/config.h — the run configuration: one YAML file parsed once into plain structs per
// subsystem, with `--set section.key=value` overrides, validated at start-up. Every field is
// listed once, in visit_fields(), which drives parsing, printing and the unknown-key check.
// Errors are ConfigError (core/error.h) with a one-line message naming the key ("optim.lr: expected
// a number, got 'fast'"); the train tool exits with code 2 on them.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "layers/model_config.h"
#include "parallel/diloco/options.h"
#include "parallel/sdp/options.h"

namespace loom {

struct DataConfig {
  std::string train = "";  // shard glob, e.g. data/fortunes/train_*.bin
  std::string val = "";    // shard glob for validation ("" = none)
  int64_t batch_size = 8;  // micro-batch B per rank
  // > 0: sequences per optimizer step, kept whatever parallel.dp is: optim.grad_accum is derived
  // as global_batch / (batch_size · dp) (a run resumed at another size sees the same data).
  int64_t global_batch = 0;
  int64_t seq_len = 64;  // T
  uint64_t seed = 1337;  // data order
  // Variable-length documents (post-training, data/packed_loader.h): document shards, each rank's
  // share of a step's batch_size·dp documents packed into micro-batches of at most
  // max_tokens_per_microbatch tokens (0: batch_size·seq_len), seq_len the longest document.
  bool packing = false;
  int64_t max_tokens_per_microbatch = 0;
  std::string balance = "none";  // none | tokens | flops: how a step's documents split over dp
  // The tokenizer the shards were prepared with (prepare_data --tokenizer): gpt2 or hf:PATH;
  // sampling encodes and decodes with it.
  std::string tokenizer = "gpt2";
};

struct OptimConfig {
  std::string name = "adamw";  // adamw | sgd
  double lr = 6e-4;            // peak learning rate
  double min_lr = 6e-5;
  std::string schedule = "cosine";  // cosine | linear | constant | wsd
  int64_t warmup_steps = 0;
  double decay_fraction = 0.2;  // wsd: fraction of steps in the final decay
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  std::string decay_rule = "default";  // default | all | matrices
  double momentum = 0.9;               // sgd
  double grad_clip = 1.0;              // global-norm clipping; 0 disables
  int64_t grad_accum = 1;              // micro-batches per optimizer step
};

struct TrainConfig {
  int64_t steps = 100;
  uint64_t seed = 1337;           // parameter init and dropout
  std::string device = "cpu";     // cpu | cuda (GPU = launcher's local rank mod visible GPUs)
  std::string dtype = "f32";      // parameters (master weights) and optimizer state: f32 | f64
  std::string precision = "f32";  // forward/backward compute dtype, Note [Precision]
  bool allow_tf32 = false;        // cuda: f32 GEMMs may use TF32 tensor cores
  // cuda: auto (cudnn where this build has it, libcudnn loads and the precision is bf16/f16;
  // else loom) | loom (Loom's flash kernels) | cudnn (cuDNN's fused attention where it handles
  // the case, Note [cuDNN attention] in kernels/attention.h)
  std::string attention_kernel = "auto";
  // Dynamic loss scaling (optim/loss_scaler.h): auto (on for f16 only) | dynamic (any precision)
  // | none (not with f16); the first scale, rounded down to a power of two.
  std::string loss_scaling = "auto";
  double initial_loss_scale = 65536.0;
  double peak_flops = 0;  // FLOP/s for MFU; 0 = measure with a short SGEMM at start
  int64_t log_every = 1;
  // The gradient noise scale (train/noise_scale.h) as a metric: needs optim.grad_accum >= 2 and
  // data parallelism alone (one process, DDP or ZeRO-1).
  bool noise_scale = false;
  // Note [Batch ramp]: over the first batch_ramp_steps steps the global batch grows linearly
  // from batch_ramp_start accumulation micro-batches to optim.grad_accum (step t runs
  // min(M, S + floor((M − S)·(t − 1)/R)) of them, M = grad_accum, S = start, R = steps), the
  // micro-batch and the data-parallel degree fixed; 0 = off. Windows and the plain runner only.
  int64_t batch_ramp_steps = 0;
  int64_t batch_ramp_start = 1;
  int64_t val_every = 50;  // 0 disables
  int64_t val_steps = 10;
  int64_t sample_every = 100;  // 0 disables
  int64_t sample_tokens = 64;
  double temperature = 1.0;
  int64_t top_k = 40;
  std::string out_dir = "runs/default";
  std::string init_from = "";  // YAML key model.init_from: native checkpoint dir or llm.c .bin
};

// Note [Precision]: train.precision is the dtype the forward and backward compute in
// (layers/module.h, Note [Compute dtype]); train.dtype is the parameters' (master) dtype.
// Equal: plain training. Otherwise the masters must be f32 (mixed precision: f32 master weights
// and optimizer state, activations in the compute dtype): bf16, f16 (with dynamic loss scaling,
// optim/loss_scaler.h) — both need train.device cuda, since the CPU kernels compute in f32/f64
// only — or f64 (a CPU check of the mixed-precision plumbing).
struct CheckpointConfig {
  int64_t every = 0;  // steps between checkpoints; 0 = only at the end
  int64_t keep = 3;   // newest checkpoints kept (0 = all)
  bool at_end = true;
  bool async = false;  // write the files on a background thread (Note [Asynchronous checkpoints])
};

struct ParallelConfig {
  int64_t dp = 1;          // data-parallel ranks; must equal the MPI world size
  int64_t zero_stage = 0;  // 0 DDP, 1 optimizer state sharded, 2 + gradients, 3 + parameters
  int64_t mics_partition_size = 0;  // > 0: MiCS, shard inside groups of this many dp·cp ranks
  double bucket_mb = 25;            // gradient bucket size
  bool overlap = true;              // false: reduce only after backward (to measure overlap)
  // false: no early tied-table part and no sparse rows (Note [Early contributions and sparse
  // rows] in parallel/dp/data_parallel.h), to measure what they do
  bool table_shortcuts = true;
  double comm_timeout_s = 300;   // a collective slower than this reports op and group
  bool tp_across_hosts = false;  // allow tensor-parallel groups that span hosts
  // ODC (zero_stage 3 only): one-sided parameter pulls and gradient pushes, one synchronisation
  // per step, so ranks may run different numbers of micro-batches (Note [ODC] in
  // parallel/odc/odc_gatherer.h); deterministic: per-origin gradient slots added in rank order.
  bool odc = false;
  bool odc_deterministic = false;
  // Communicators: nccl (one GPU per rank; CPU tensors still go over MPI), mpi (CUDA tensors
  // staged through pinned host memory: several ranks may share a GPU), mpi_nccl_rules (MPI
  // following NCCL's point-to-point rules, to check NCCL safety on CPUs), auto = nccl when
  // train.device is cuda, else mpi.
  std::string backend = "auto";
  // Pipeline parallelism (parallel/pp; docs/parallel.md): world = dp·pp.
  int64_t pp = 1;                 // pipeline stages
  int64_t vpp = 1;                // chunks per pp rank: interleaved (any), zb-v (2; 1 → 2)
  int64_t microbatches = 0;       // per step; 0 = optim.grad_accum (see pipeline_microbatches)
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved | zb-h1 | zb-v
  // zb-h1, zb-v: the op costs their lists are built at (Note [Schedule costs] in
  // parallel/pp/schedule.h): unit | measured (the first step's) | "F,B,W" ratios
  std::string schedule_costs = "unit";
  std::string pp_layout = "";  // blocks per stage, e.g. "3,3,2,2"; "" = even split
  // Tensor, sequence and context parallelism (parallel/tp, parallel/cp; docs/parallel.md):
  // world = dp·pp·cp·tp.
  int64_t tp = 1;                     // tensor-parallel ranks (heads, MLP hidden, vocabulary split)
  int64_t cp = 1;                     // context-parallel ranks (the sequence split)
  std::string cp_attention = "ring";  // ring | ulysses | hybrid (parallel/cp/ulysses.h, hybrid.h)
  int64_t cp_ulysses = 0;             // hybrid: Ulysses ranks u of cp = u·r (the ring's r = cp/u)
  bool sequence_parallel = false;     // with tp > 1: norms/dropout/residual on sequence chunks
  // parallel.sdp: subnetwork data parallelism (docs/parallel.md, "SDP"), written as a mapping
  // under parallel (parallel: {sdp: {mode: forward, coverage: 0.5}}); its options and their
  // validation are SDP's (parallel/sdp/options.h).
  parallel::sdp::SdpOptions sdp;
  // parallel.diloco: islands that sync every inner_steps (docs/parallel.md, "DiLoCo"); its
  // options and checks are DiLoCo's (parallel/diloco/options.h).
  parallel::diloco::DilocoOptions diloco;
};

struct LoggingConfig {
  bool jsonl = true;
  bool tensorboard = true;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  ParallelConfig parallel;
};

// Reads `path`, applies overrides ("section.key=value", value parsed as YAML), rejects unknown
// keys and wrong types, and validates values (validate_config).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
Config parse_config_text(const std::string& yaml_text,
                         const std::vector<std::string>& overrides = {});
// The pipeline's micro-batches per step: parallel.microbatches, or optim.grad_accum when 0. They
// are the gradient-accumulation micro-batches (data.batch_size rows each), so a pipelined run
// sees the same global batch as the single-process run with grad_accum = m.
int64_t pipeline_microbatches(const Config& c);
// Sequences one optimizer step takes from the data: data.batch_size rows of every micro-batch
// (optim.grad_accum, or the pipeline's) of every data-parallel replica (parallel.dp; context,
// tensor and pipeline parallelism split a sequence, they do not add any).
int64_t global_batch_sequences(const Config& c);
// A train.dtype / train.precision value (f64, f32, bf16, f16; validated when parsed) as a DType.
DType train_dtype(const std::string& name);
// parallel.backend resolved: true when the communicators are NCCL's (nccl, or auto on cuda).
bool uses_nccl(const Config& c);
// The accumulation micro-batches of step t (1-based) under train.batch_ramp_steps (Note [Batch
// ramp]); optim.grad_accum without a ramp.
int64_t ramp_micro_batches(const Config& c, int64_t step);
// Impossible values and combinations, each naming its key(s).
void validate_config(const Config& c);
// The effective configuration as YAML (every key, defaults included).
std::string config_to_yaml(const Config& c);
// A config's YAML as "section.key" (nested sections: "parallel.sdp.seed") → the value's YAML
// text on one line (flow style), for comparing two configs key by key (the resume's changes).
std::map<std::string, std::string> flatten_config(const std::string& yaml);

}  // namespace loom
