// tests/train/train_sdp_mpi_test.cpp — the trainer under mpirun with SDP (parallel.sdp, train/
// plan.h Note [SDP plan]) in both regimes (forward, backward masking) at both levels (neuron,
// block). Coverage 1 is plain data parallelism (losses, norms and parameters to f32 rounding),
// also with 2 accumulation micro-batches. At coverage 1/2 (and 1/4 at 8 ranks), and with
// data-parallel copies of an SDP group (parallel.sdp.workers), every rank's parameters after 3
// steps equal rank r of a single-process reference built here from the cover alone: one model
// per rank (the worker's subnetwork), each on the batch its rank reads; every element of every
// global parameter averaged over the ranks that train it (found by mapping each trained
// element to its global index through the cover's units, not through placements), Σ g² over the
// global elements once, clipping and AdamW per rank, and under backward masking every frozen
// copy then set from a trained one; so do the logged losses and norms, and the validation loss.
// Checkpoints: a run stopped and resumed equals the straight run bitwise, and the checkpoint of
// an SDP run, read by one process, is the full model whose elements are the ranks' trained
// values (consolidation); forward masking starts from a full checkpoint (model.init_from). The
// neuron level and the heads option also run a Llama with the Hugging Face families' options
// (every bias, heads of 12, Llama 3 RoPE scaling, a sliding window; q/k norms but with heads).
// loom-mpi-test: ranks 4 8 timeout 600
// loom-multihost-test: 2x2
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "core/autograd.h"
#include "core/ops/view.h"
#include "data/loader.h"
#include "optim/clip.h"
#include "optim/decay_rule.h"
#include "optim/lr_schedule.h"
#include "parallel/parallel_context.h"
#include "parallel/sdp/backward_masking.h"
#include "parallel/sdp/block_level.h"
#include "parallel/sdp/forward_masking.h"
#include "tests/parallel/mpi_test_util.h"
#include "tests/train/train_test_util.h"
#include "train/checkpoint.h"
#include "train/plan.h"
#include "train/trainer.h"

namespace loom::parallel {
namespace {

// `kv_groups` > 0 (the heads option): 8 query heads in that many KV groups (GPT-2: 8 heads).
// "llama_ext": Llama with the Hugging Face families' options at once (Note [Hugging Face
// families] in train/hf_format.h): heads of 12, every bias, q/k norms, Llama 3's RoPE scaling and
// a 5-token sliding window; "llama_ext_heads" the same without q/k norms, which
// parallel.sdp.heads refuses by name.
std::string model_yaml(const std::string& arch, int n_layer, int kv_groups = 0) {
  const std::string layers = "n_layer: " + std::to_string(n_layer);
  if (arch.starts_with("llama")) {
    const std::string heads = kv_groups > 0 ? "n_head: 8, n_kv_head: " + std::to_string(kv_groups)
                                            : std::string("n_head: 2, n_kv_head: 1");
    const std::string ext =
        arch.starts_with("llama_ext")
            ? std::string(
                  ", head_dim: 12, attention_bias: true, mlp_bias: true, sliding_window: "
                  "5, rope_scaling: {type: llama3, factor: 8, original_max_seq_len: 8}") +
                  (arch == "llama_ext" ? ", qk_norm: true" : "")
            : "";
    return "model: {arch: llama, vocab_size: 64, vocab_multiple: 32, " + layers + ", " + heads +
           ", n_embd: 32, ffn_multiple: 8, tie_embeddings: false, max_seq_len: 16" + ext + "}\n";
  }
  return "model: {arch: gpt2, vocab_size: 64, vocab_multiple: 32, " + layers +
         ", n_head: " + std::to_string(kv_groups > 0 ? 8 : 2) + ", n_embd: 32, max_seq_len: 16}\n";
}

// mode "none": plain data parallelism (parallel.dp = world, ZeRO 0).
struct SdpCase {
  std::string arch = "gpt2";
  std::string mode = "forward", level = "neuron";
  double coverage = 1.0;
  int workers = 0;    // 0: the dp group
  int kv_groups = 0;  // > 0: parallel.sdp.heads, a model with that many KV groups
  int n_layer() const { return level == "block" ? 4 : 2; }
  std::string tag() const {
    return arch + "_" + mode + "_" + level + "_" +
           std::to_string(static_cast<int>(coverage * 100)) + "_w" + std::to_string(workers) +
           (kv_groups > 0 ? "_heads" : "");
  }
};

Config config_for(const std::string& dir, const std::string& out, const SdpCase& c, int dp,
                  int64_t steps = 3, int64_t grad_accum = 1, int64_t checkpoint_every = 0) {
  std::ostringstream y;
  y << model_yaml(c.arch, c.n_layer(), c.kv_groups) << "data: {train: " << dir
    << "/data/train_*.bin, val: " << dir << "/data/train_*.bin, batch_size: 2, seq_len: 16}\n"
    << "optim: {lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 2, eps: 1.0e-6, grad_clip: 0.5, "
    << "grad_accum: " << grad_accum << "}\n"
    << "train: {steps: " << steps
    << ", peak_flops: 1.0e10, log_every: 100, val_every: 0, val_steps: 2, sample_every: 0, "
       "out_dir: "
    << out << "}\n"
    << "checkpoint: {every: " << checkpoint_every
    << ", keep: 0, at_end: " << (checkpoint_every > 0 ? "true" : "false") << ", async: false}\n"
    << "logging: {jsonl: false, tensorboard: false}\n"
    << "parallel: {dp: " << dp << ", zero_stage: 0, bucket_mb: 0.01";
  if (c.mode != "none") {
    y << ", sdp: {mode: " << c.mode << ", level: " << c.level << ", coverage: " << c.coverage
      << ", seed: 5, workers: " << c.workers << ", heads: " << (c.kv_groups > 0 ? "true" : "false")
      << "}";
  }
  y << "}\n";
  return parse_config_text(y.str());
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  EXPECT_EQ(x.size(), y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

// Coverage 1 against DDP; with accumulation (grad_accum 2) SdpSync's hooks launch only at the
// second micro-batch's backward (Note [SDP overlapped sync]) and the steps still agree.
void expect_coverage_one_is_ddp(SdpCase c, int64_t grad_accum) {
  ParallelOptions po;
  po.shape.dp = testing::world_size();
  ParallelContext ctx = ParallelContext::create(po);
  const int n = ctx.dp_size();
  const std::string dir = testing::shared_train_data(ctx, "loom_train_sdp1");
  std::ostringstream log;
  c.coverage = 1.0;
  const std::string tag = c.tag() + "_accum" + std::to_string(grad_accum);
  Trainer sdp(config_for(dir, dir + "/sdp_" + tag, c, n, 4, grad_accum),
              testing::trainer_options(log, &ctx));
  const auto a = sdp.run();
  SdpCase plain = c;
  plain.mode = "none";
  Trainer ddp(config_for(dir, dir + "/ddp_" + tag, plain, n, 4, grad_accum),
              testing::trainer_options(log, &ctx));
  const auto b = ddp.run();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i].loss, b[i].loss, 1e-6 * std::abs(b[i].loss)) << tag << " step " << i + 1;
    EXPECT_NEAR(a[i].grad_norm, b[i].grad_norm, 1e-5 * b[i].grad_norm) << tag << " step " << i + 1;
  }
  const auto pa = sdp.parameters(), pb = ddp.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_LE(max_abs_diff(pa[i].second, pb[i].second), 2e-5) << tag << " " << pa[i].first;
  }
  ctx.world().barrier();
}

TEST(TrainSdp, CoverageOneIsDataParallelism) {
  for (const char* arch : {"gpt2", "llama"}) {
    for (const char* mode : {"forward", "backward"}) {
      for (const char* level : {"neuron", "block"}) {
        SdpCase c;
        c.arch = arch;
        c.mode = mode;
        c.level = level;
        expect_coverage_one_is_ddp(c, 1);
      }
    }
  }
}

TEST(TrainSdp, CoverageOneWithAccumulationIsDataParallelism) {
  expect_coverage_one_is_ddp(SdpCase{}, 2);
}

// The packed dim of an MLP parameter by its name (fc/gate/up rows, proj/down columns), -1 for
// a parameter every worker holds whole. From the model's structure, not from placements.
int64_t packed_dim(const std::string& name) {
  for (const char* rows : {".mlp.fc.weight", ".mlp.fc.bias", ".mlp.gate.weight", ".mlp.gate.bias",
                           ".mlp.up.weight", ".mlp.up.bias"})
    if (name.ends_with(rows)) return 0;
  for (const char* cols : {".mlp.proj.weight", ".mlp.down.weight"})
    if (name.ends_with(cols)) return 1;
  return -1;
}

int64_t block_of(const std::string& name) {
  if (name.rfind("blocks.", 0) != 0) return -1;
  return std::stoll(name.substr(7, name.find('.', 7) - 7));  // "blocks.<l>.…"
}

// A tensor of a reference rank with the global flat index of each of its elements.
struct Mapped {
  std::string name;
  Tensor t;
  std::vector<int64_t> global;
  int64_t global_numel = 0;
  bool split = false;  // a slice of the cover (held by k workers per copy), not replicated
};

// Maps (name, t) to global indices: at the neuron level a packed dim's local index i is the
// i-th of `units` (the worker's owned units for a trained tensor, the others for a frozen copy).
// With the heads option the attention's qkv rows (q, k, v of the held KV groups) and proj
// columns (their query heads) map through the heads cover (Note [SDP packed heads]).
Mapped map_head_tensor(const std::string& name, const Tensor& t, const ModelConfig& mc,
                       const sdp::NeuronAssignment& heads, int worker, bool frozen) {
  Mapped m{name, t, {}, 0, true};
  const int64_t groups = mc.kv_heads(), g = mc.n_head / groups, d = mc.head_dim();
  const int64_t q_rows = groups * g * d, kv_rows = groups * d;
  const sdp::LayerCover& layer = heads.layers[static_cast<size_t>(block_of(name))];
  std::vector<int64_t> owned;  // the groups of this tensor: held (trained) or not (frozen copy)
  for (int64_t u = 0; u < layer.units; ++u) {
    bool held = false;
    for (int64_t o : layer.owned_units(worker)) held = held || o == u;
    if (held != frozen) owned.push_back(u);
  }
  std::vector<int64_t> rows;  // the global rows (qkv) or columns (proj) held, in local order
  for (int64_t u : owned)
    for (int64_t i = 0; i < g * d; ++i) rows.push_back(u * g * d + i);
  if (!name.ends_with(".attn.proj.weight")) {
    for (int64_t base : {q_rows, q_rows + kv_rows})
      for (int64_t u : owned)
        for (int64_t i = 0; i < d; ++i) rows.push_back(base + u * d + i);
  }
  const Shape shape = t.shape();
  const int64_t local = static_cast<int64_t>(rows.size());
  if (name.ends_with(".attn.proj.weight")) {  // (C, q held): columns
    EXPECT_EQ(shape[1], local) << name;
    m.global_numel = shape[0] * q_rows;
    for (int64_t o = 0; o < shape[0]; ++o)
      for (int64_t j = 0; j < local; ++j)
        m.global.push_back(o * q_rows + rows[static_cast<size_t>(j)]);
    return m;
  }
  EXPECT_EQ(shape[0], local) << name;
  const int64_t inner = shape.size() > 1 ? shape[1] : 1;
  m.global_numel = (q_rows + 2 * kv_rows) * inner;
  for (int64_t r : rows)
    for (int64_t k = 0; k < inner; ++k) m.global.push_back(r * inner + k);
  return m;
}

Mapped map_tensor(const std::string& name, const Tensor& t, const SdpCase& c,
                  const sdp::NeuronAssignment* cover, int worker, bool frozen,
                  const sdp::NeuronAssignment* heads = nullptr, const ModelConfig* mc = nullptr) {
  if (heads != nullptr && (name.ends_with(".attn.qkv.weight") || name.ends_with(".attn.qkv.bias") ||
                           name.ends_with(".attn.proj.weight")))
    return map_head_tensor(name, t, *mc, *heads, worker, frozen);
  Mapped m{name, t, {}, t.numel(), false};
  const int64_t dim = c.level == "neuron" ? packed_dim(name) : -1;
  if (c.level == "block") m.split = block_of(name) >= 0;
  if (dim < 0) {
    for (int64_t i = 0; i < t.numel(); ++i) m.global.push_back(i);
    return m;
  }
  m.split = true;
  const sdp::LayerCover& layer = cover->layers[static_cast<size_t>(block_of(name))];
  std::vector<int64_t> units;
  for (int64_t u = 0; u < layer.units; ++u) {
    bool own = false;
    for (int64_t o : layer.owned_units(worker)) own = own || o == u;
    if (own != frozen) units.push_back(u);
  }
  const Shape shape = t.shape();
  EXPECT_EQ(shape[static_cast<size_t>(dim)], static_cast<int64_t>(units.size())) << name;
  const int64_t outer = dim == 0 ? 1 : shape[0];
  const int64_t inner = dim == 0 ? (shape.size() > 1 ? shape[1] : 1) : 1;
  const int64_t m_local = static_cast<int64_t>(units.size());
  m.global_numel = outer * layer.units * inner;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t p = 0; p < m_local; ++p)
      for (int64_t k = 0; k < inner; ++k)
        m.global.push_back((o * layer.units + units[static_cast<size_t>(p)]) * inner + k);
  return m;
}

struct RefRank {
  std::unique_ptr<Transformer> model;
  LayerContext layers;
  std::vector<Mapped> trained, frozen;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<DataLoader> loader;
};

// Rank d's reference (worker d mod N): its subnetwork built with the worker's context, its
// trained tensors and frozen copies mapped to global indices.
void build_rank(RefRank& r, const Config& cfg, const SdpCase& c, int rank, int workers,
                const std::string& data) {
  const int w = rank % workers;
  sdp::CoverOptions co;
  co.workers = workers;
  co.coverage = c.coverage;
  co.seed = static_cast<uint64_t>(cfg.parallel.sdp.seed);
  const bool forward = c.mode == "forward";
  std::unique_ptr<sdp::NeuronAssignment> cover, heads;
  std::unique_ptr<sdp::BlockAssignment> blocks;
  if (c.level == "block") {
    blocks = std::make_unique<sdp::BlockAssignment>(sdp::assign_blocks(co, cfg.model.n_layer));
    r.layers = sdp::block_masking_context(*blocks, w, forward);
  } else {
    cover = std::make_unique<sdp::NeuronAssignment>(sdp::assign_neurons(
        co,
        std::vector<int64_t>(static_cast<size_t>(cfg.model.n_layer), cfg.model.ffn_hidden_size())));
    std::optional<sdp::NeuronAssignment> head_cover;
    if (c.kv_groups > 0) {  // the heads option: KV groups, drawn with seed + 1 (train/plan.cpp)
      sdp::CoverOptions ho = co;
      ho.seed += 1;
      heads = std::make_unique<sdp::NeuronAssignment>(sdp::assign_neurons(
          ho, std::vector<int64_t>(static_cast<size_t>(cfg.model.n_layer), c.kv_groups)));
      head_cover = *heads;
    }
    r.layers = forward ? sdp::forward_masking_context(*cover, w, head_cover)
                       : sdp::backward_masking_context(*cover, w, head_cover);
  }
  r.model = std::make_unique<Transformer>(cfg.model, DType::kF32, Device{}, r.layers);
  Generator gen(cfg.train.seed);
  r.model->init_weights(gen);
  std::vector<std::pair<std::string, Tensor>> trained;
  for (auto& [name, p] : r.model->named_parameters()) {
    const bool held =
        c.level != "block" || forward || block_of(name) < 0 || blocks->holds(w, block_of(name));
    if (held) {
      trained.emplace_back(name, p);
      r.trained.push_back(map_tensor(name, p, c, cover.get(), w, false, heads.get(), &cfg.model));
    } else {
      Tensor f = p;
      f.set_requires_grad(false);
      r.frozen.push_back(map_tensor(name, f, c, nullptr, w, true));
    }
  }
  if (c.level == "neuron" && !forward) {
    auto f = std::dynamic_pointer_cast<const sdp::BackwardMaskingLinear>(r.layers.linear);
    ASSERT_NE(f, nullptr);
    for (auto& [name, t] : sdp::frozen_parameters(*f, r.model->named_parameters()))
      r.frozen.push_back(map_tensor(name, t, c, cover.get(), w, true, heads.get(), &cfg.model));
  }
  const optim::DecayRule rule = optim::parse_decay_rule(cfg.optim.decay_rule);
  r.opt = optimizer_factory(cfg.optim)(optim::make_param_refs(trained, rule));
  r.loader = std::make_unique<DataLoader>(std::vector<std::string>{data}, cfg.data.batch_size,
                                          cfg.data.seq_len, rank, cfg.parallel.dp, cfg.data.seed,
                                          cfg.model.vocab_size);
}

// Averages every global element over the ranks that train it, checks the count (k per copy for
// a split element, every rank otherwise), writes the averages back as the gradients, and
// returns Σ g² over the global elements.
double average_like_sdp(std::vector<RefRank>& rs, int expected_split) {
  std::map<std::string, std::vector<double>> sum;
  std::map<std::string, std::vector<int>> count;
  std::map<std::string, bool> split;
  for (RefRank& r : rs) {
    for (Mapped& m : r.trained) {
      auto& s = sum[m.name];
      auto& n = count[m.name];
      s.resize(static_cast<size_t>(m.global_numel), 0.0);
      n.resize(static_cast<size_t>(m.global_numel), 0);
      split[m.name] = m.split;
      const Tensor g = m.t.grad();
      const std::vector<double> v =
          g.defined() ? g.to_vector() : std::vector<double>(m.global.size(), 0.0);
      for (size_t i = 0; i < v.size(); ++i) {
        s[static_cast<size_t>(m.global[i])] += v[i];
        ++n[static_cast<size_t>(m.global[i])];
      }
    }
  }
  double sq = 0;
  const int all = static_cast<int>(rs.size());
  for (auto& [name, s] : sum) {
    const std::vector<int>& n = count[name];
    for (size_t i = 0; i < s.size(); ++i) {
      EXPECT_EQ(n[i], split[name] ? expected_split : all) << name << " element " << i;
      if (n[i] == 0) continue;
      s[i] /= n[i];
      sq += s[i] * s[i];
    }
  }
  for (RefRank& r : rs) {
    for (Mapped& m : r.trained) {
      std::vector<float> f;
      for (int64_t gi : m.global)
        f.push_back(static_cast<float>(sum[m.name][static_cast<size_t>(gi)]));
      m.t.set_grad(Tensor::from_vector(f, m.t.shape()));
    }
  }
  return sq;
}

// Backward masking's publication in the reference: every frozen copy takes its elements' values
// from a trained copy (the holders agree after the step).
void publish_like_sdp(std::vector<RefRank>& rs) {
  std::map<std::string, std::vector<double>> value;
  for (RefRank& r : rs) {
    for (Mapped& m : r.trained) {
      auto& v = value[m.name];
      v.resize(static_cast<size_t>(m.global_numel), 0.0);
      const std::vector<double> x = m.t.to_vector();
      for (size_t i = 0; i < x.size(); ++i) v[static_cast<size_t>(m.global[i])] = x[i];
    }
  }
  for (RefRank& r : rs) {
    for (Mapped& m : r.frozen) {
      std::vector<float> f;
      for (int64_t gi : m.global)
        f.push_back(static_cast<float>(value.at(m.name)[static_cast<size_t>(gi)]));
      ops::copy_(m.t, Tensor::from_vector(f, m.t.shape()));
    }
  }
}

// Tolerance: the reference averages in f64 and rounds once to f32; the ranks sum in f32 in rank
// order. After 3 AdamW steps (lr ≤ 1e-2) the parameters agree to 2e-5 absolute.
void check_against_reference(const SdpCase& c) {
  ParallelOptions po;
  po.shape.dp = testing::world_size();
  ParallelContext ctx = ParallelContext::create(po);
  const int d = ctx.dp_size();
  const int n = c.workers > 0 ? c.workers : d;
  const std::string dir = testing::shared_train_data(ctx, "loom_train_sdp");
  std::ostringstream log;
  const Config cfg = config_for(dir, dir + "/sdp_" + c.tag(), c, d);
  Trainer trainer(cfg, testing::trainer_options(log, &ctx));
  const std::vector<StepRecord> records = trainer.run();

  std::vector<RefRank> rs(static_cast<size_t>(d));
  for (int r = 0; r < d; ++r)
    build_rank(rs[static_cast<size_t>(r)], cfg, c, r, n, dir + "/data/train_000000.bin");
  const int k = static_cast<int>(std::lround(c.coverage * n));
  const optim::LrSchedule schedule{cfg.optim.schedule, cfg.optim.lr,
                                   cfg.optim.min_lr,   cfg.optim.warmup_steps,
                                   cfg.train.steps,    cfg.optim.decay_fraction};
  ASSERT_EQ(records.size(), static_cast<size_t>(cfg.train.steps));
  for (int64_t step = 0; step < cfg.train.steps; ++step) {
    double loss = 0;
    for (RefRank& r : rs) {
      for (Mapped& m : r.trained) m.t.zero_grad();
      const Batch b = r.loader->next();
      const Tensor l = r.model->loss(b.inputs, b.targets);
      loss += l.item() / d;
      autograd::backward(l);
    }
    const double sq = average_like_sdp(rs, k * (d / n));
    const Tensor factor =
        optim::clip_scale_tensor(Tensor::scalar(sq, DType::kF64), cfg.optim.grad_clip);
    for (RefRank& r : rs) r.opt->step_scaled(schedule.lr_at(step), factor);
    publish_like_sdp(rs);
    const StepRecord& got = records[static_cast<size_t>(step)];
    EXPECT_NEAR(got.loss, loss, 1e-5 * std::abs(loss)) << c.tag() << " step " << step + 1;
    EXPECT_NEAR(got.grad_norm, std::sqrt(sq), 1e-5 * std::sqrt(sq))
        << c.tag() << " step " << step + 1;
  }
  // Validation: every rank's model on the same batches (rank 0 of 1), the mean over the ranks.
  const double val = trainer.evaluate();
  double want_val = 0;
  {
    autograd::NoGradGuard no_grad;
    for (RefRank& r : rs) {
      DataLoader v(std::vector<std::string>{dir + "/data/train_000000.bin"}, cfg.data.batch_size,
                   cfg.data.seq_len, 0, 1, cfg.data.seed, cfg.model.vocab_size);
      for (int64_t i = 0; i < cfg.train.val_steps; ++i) {
        const Batch b = v.next();
        want_val += r.model->loss(b.inputs, b.targets).item() /
                    static_cast<double>(d * cfg.train.val_steps);
      }
    }
  }
  EXPECT_NEAR(val, want_val, 1e-5 * std::abs(want_val)) << c.tag();
  const auto got = trainer.parameters();
  const auto want = rs[static_cast<size_t>(ctx.dp_rank())].model->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_LE(max_abs_diff(got[i].second, want[i].second), 2e-5)
        << c.tag() << " rank " << ctx.dp_rank() << " " << got[i].first;
  }
  ctx.world().barrier();
}

SdpCase half(const std::string& arch, const std::string& mode, const std::string& level,
             int workers = 0) {
  SdpCase c;
  c.arch = arch;
  c.mode = mode;
  c.level = level;
  c.coverage = 0.5;
  c.workers = workers;
  return c;
}

TEST(TrainSdp, ForwardNeuronMatchesTheReference) {
  check_against_reference(half("gpt2", "forward", "neuron"));
  check_against_reference(half("llama", "forward", "neuron"));
  check_against_reference(half("llama_ext", "forward", "neuron"));
}
TEST(TrainSdp, BackwardNeuronMatchesTheReference) {
  check_against_reference(half("gpt2", "backward", "neuron"));
  check_against_reference(half("llama", "backward", "neuron"));
  check_against_reference(half("llama_ext", "backward", "neuron"));
}
TEST(TrainSdp, ForwardBlockMatchesTheReference) {
  check_against_reference(half("gpt2", "forward", "block"));
  check_against_reference(half("llama", "forward", "block"));
}
TEST(TrainSdp, BackwardBlockMatchesTheReference) {
  check_against_reference(half("gpt2", "backward", "block"));
  check_against_reference(half("llama", "backward", "block"));
}
// parallel.sdp.heads: the attention's KV groups covered too (both regimes, neuron level),
// GPT-2 with 8 heads and Llama with 8 query heads in dp KV groups (GQA at 4 ranks).
TEST(TrainSdp, HeadsMatchTheReference) {
  const int d = testing::world_size();
  for (const char* mode : {"forward", "backward"}) {
    for (const char* arch : {"gpt2", "llama", "llama_ext_heads"}) {
      SdpCase c = half(arch, mode, "neuron");
      c.kv_groups = std::string(arch) == "gpt2" ? 8 : d;
      check_against_reference(c);
    }
  }
  SdpCase one = half("llama", "forward", "neuron");
  one.kv_groups = d;
  expect_coverage_one_is_ddp(one, 1);
}

TEST(TrainSdp, QuarterCoverageMatchesTheReference) {
  if (testing::world_size() < 8) GTEST_SKIP() << "coverage 1/4 needs k = N/4 >= 2 holders";
  for (const char* mode : {"forward", "backward"}) {
    SdpCase c = half("gpt2", mode, "neuron");
    c.coverage = 0.25;
    check_against_reference(c);
  }
}
// parallel.sdp.workers: the dp group holds dp / N copies of an SDP group of N (Note [SDP
// replicas]); at 4 ranks two copies of 2 workers (k = 1 would not be connected, so C = 1: the
// replicated part's and the copies' averaging), at 8 ranks two copies of 4 workers at C = 1/2.
TEST(TrainSdp, DataParallelCopiesMatchTheReference) {
  const int d = testing::world_size();
  for (const char* mode : {"forward", "backward"}) {
    for (const char* level : {"neuron", "block"}) {
      SdpCase c = half("gpt2", mode, level, d / 2);
      if (d < 8) c.coverage = 1.0;
      check_against_reference(c);
    }
  }
}

// Exact resume: 4 steps straight equal 2 steps, a checkpoint, and 2 more after --resume, bitwise
// (losses, norms, parameters); and the checkpoint read by one process is the full model whose
// elements are what the ranks train (each rank checks its own trained tensors, mapped to global
// indices through the cover), and every stored tensor is complete (the reader refuses a gap).
void check_resume_and_consolidation(const SdpCase& c) {
  ParallelOptions po;
  po.shape.dp = testing::world_size();
  ParallelContext ctx = ParallelContext::create(po);
  const int d = ctx.dp_size();
  const int n = c.workers > 0 ? c.workers : d;
  const std::string dir = testing::shared_train_data(ctx, "loom_train_sdp_ckpt");
  std::ostringstream log;
  const std::string straight = dir + "/straight_" + c.tag(), resumed = dir + "/resumed_" + c.tag();
  Trainer a(config_for(dir, straight, c, d, 4, 1, 2), testing::trainer_options(log, &ctx));
  const auto ra = a.run();
  {
    Trainer b1(config_for(dir, resumed, c, d, 4, 1, 2), testing::trainer_options(log, &ctx, "", 2));
    b1.run();
  }
  Trainer b(config_for(dir, resumed, c, d, 4, 1, 2), testing::trainer_options(log, &ctx, "latest"));
  const auto rb = b.run();
  ASSERT_EQ(rb.size(), 2u) << c.tag();
  for (size_t i = 0; i < rb.size(); ++i) {
    EXPECT_EQ(rb[i].loss, ra[i + 2].loss) << c.tag() << " step " << i + 3;
    EXPECT_EQ(rb[i].grad_norm, ra[i + 2].grad_norm) << c.tag() << " step " << i + 3;
  }
  const auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(max_abs_diff(pa[i].second, pb[i].second), 0.0) << c.tag() << " " << pa[i].first;

  // Consolidation: the final checkpoint, whole.
  const CheckpointContents full = load_checkpoint(latest_checkpoint(straight + "/checkpoints"));
  std::map<std::string, Tensor> stored;
  for (const CheckpointTensor& t : full.tensors) stored[t.name] = t.values;
  RefRank me;
  build_rank(me, config_for(dir, straight, c, d, 4, 1, 2), c, ctx.dp_rank(), n,
             dir + "/data/train_000000.bin");
  const auto params = a.parameters();
  std::map<std::string, Tensor> mine(params.begin(), params.end());
  for (const Mapped& m : me.trained) {
    auto it = stored.find("model." + m.name);
    ASSERT_NE(it, stored.end()) << m.name;
    ASSERT_EQ(it->second.numel(), m.global_numel) << m.name;
    const std::vector<double> whole = it->second.to_vector(), local = mine.at(m.name).to_vector();
    for (size_t i = 0; i < local.size(); ++i)
      ASSERT_EQ(whole[static_cast<size_t>(m.global[i])], local[i]) << c.tag() << " " << m.name;
  }
  // Forward masking starts from a full checkpoint (model.init_from): each rank takes its slices.
  if (c.mode == "forward") {
    Config from = config_for(dir, dir + "/init_" + c.tag(), c, d, 4, 1, 0);
    from.train.init_from = latest_checkpoint(straight + "/checkpoints");
    Trainer t(from, testing::trainer_options(log, &ctx));
    const auto loaded = t.parameters();
    std::map<std::string, Tensor> got(loaded.begin(), loaded.end());
    for (const Mapped& m : me.trained) {
      const std::vector<double> whole = stored.at("model." + m.name).to_vector(),
                                local = got.at(m.name).to_vector();
      for (size_t i = 0; i < local.size(); ++i)
        ASSERT_EQ(whole[static_cast<size_t>(m.global[i])], local[i]) << "init_from " << m.name;
    }
  }
  // A single-process model of the same config loads it (the full model), and its optimizer state
  // is complete: one process resumes it.
  if (ctx.rank() == 0) {
    SdpCase one = c;
    one.mode = "none";
    Config cfg = config_for(dir, dir + "/one_" + c.tag(), one, 1, 4, 1, 2);
    std::filesystem::create_directories(cfg.train.out_dir + "/checkpoints");
    std::filesystem::copy(latest_checkpoint(straight + "/checkpoints"),
                          cfg.train.out_dir + "/checkpoints/" + checkpoint_dir_name(4),
                          std::filesystem::copy_options::recursive);
    std::ostringstream one_log;
    Trainer t(cfg, testing::trainer_options(one_log, nullptr, "latest"));
    for (const auto& [name, p] : t.parameters())
      EXPECT_EQ(max_abs_diff(p, stored.at("model." + name)), 0.0) << c.tag() << " " << name;
  }
  ctx.world().barrier();
}

TEST(TrainSdp, ResumesExactlyAndConsolidates) {
  for (const char* mode : {"forward", "backward"})
    for (const char* level : {"neuron", "block"})
      check_resume_and_consolidation(half("llama", mode, level));
  for (const char* mode : {"forward", "backward"}) {
    SdpCase heads = half("llama", mode, "neuron");
    heads.kv_groups = testing::world_size();
    check_resume_and_consolidation(heads);
  }
}

}  // namespace
}  // namespace loom::parallel
