// tests/train/train_tp_mpi_test.cpp — the trainer under mpirun with tensor, sequence and context
// parallelism, alone and with data parallelism and ZeRO: per-step losses and gradient norms match
// the single-process run with the same global batch, and every rank's parameters equal its
// tensor-parallel part of the single-process parameters (tests/parallel/tp/tp_test_util.h); at dp 1
// (pp too) the validation loss matches the single process's; a stop and resume reproduces the
// uninterrupted run. With dropout 0.1 (tp2, tp2+sp, tp2+sp with activation checkpointing, cp2,
// cp2·tp2+sp) every rank draws the single-process masks of the rows it holds, so the runs still
// match. TrainModelParallel2.* runs on 2 ranks, TrainModelParallel4.* on 4 (with pp2 too, and MiCS
// over dp·cp), TrainModelParallel8.* on 8 (the compositions dp2·tp2·pp2, tp2·cp2·pp2 and
// dp2·cp2·tp2, each also with ZeRO-1, plus dp2·tp2·pp2+sp with ZeRO-3, tp2·cp2·pp2 with ZeRO-2, and
// the hybrid cp4 (u2×r2) under dp2 ZeRO-1 and tp2+sp); each case skips itself at the other world
// sizes. The Hugging Face families (Note [Hugging Face families] in train/hf_format.h) have rows of
// their own: Llama's options under tp+sp, cp and dp·tp ZeRO-3, Qwen3 under tp, tp+sp, cp and MiCS,
// Qwen2 under ZeRO-3, Mistral's sliding window under tp+sp with checkpointing and ZeRO-2. The
// zero-bubble schedules run under tp2·pp2 with sequence parallelism (zb-h1, zb-v) and cp2·pp2
// (zb-v); selective recompute (model.recompute: selective) under tp2 (with and without sp),
// cp2 (ring and Ulysses), the hybrid cp4 and dp2·tp2+sp ZeRO-3; Ulysses attention
// (parallel.cp_attention: ulysses) under cp2 (also with dropout, Mistral's window and Qwen3's
// grouped heads), cp2·tp2+sp, cp2·pp2 and cp4; hybrid attention (parallel.cp_attention: hybrid,
// cp_ulysses 2: Ulysses × ring) under cp4, with dropout and with Llama's heads. The step line's
// exposed communication names tp, cp, the pipeline's sends and the gradient sync exactly where the
// layout has them.
//
// loom-mpi-test: ranks 2 4 8
// loom-multihost-test: 2x2 2x4
//
// Tolerance: split GEMMs, vocab-parallel statistics, ring-attention merges and the dp·cp
// gradient average add the same terms in other orders (f32 rounding, ~1e-7 relative), which
// AdamW's normalised update can spread over the 6 steps: 1e-5 relative on losses and norms and
// 2e-5 absolute on parameters (weights are O(0.02-1)). The worst measured is 6.8e-6, on a
// LayerNorm weight (O(1)) under tp2: its gradient sums many small terms, and AdamW divides a
// near-zero gradient's rounding difference by its own small second moment.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "data/shard.h"
#include "layers/transformer.h"
#include "parallel/parallel_context.h"
#include "tests/parallel/mpi_test_util.h"
#include "tests/parallel/tp/tp_test_util.h"
#include "tests/train/train_test_util.h"
#include "train/trainer.h"

namespace loom::parallel {
namespace {
namespace fs = std::filesystem;

constexpr double kLossRelTol = 1e-5;
constexpr double kParamAbsTol = 2e-5;

struct Case {
  std::string arch = "gpt2";
  int dp = 1, cp = 1, tp = 1, pp = 1;
  bool sp = false;
  int zero_stage = 0;
  double dropout = 0.0;
  std::string precision = "f32";      // train.precision (f64: f32 masters, f64 compute)
  int mics = 0;                       // parallel.mics_partition_size
  bool checkpointing = false;         // model.recompute: full
  std::string selective = "";         // model.recompute: selective keeping this list
  double loss_scale = 0;              // > 0: train.loss_scaling dynamic from this initial scale
  std::string optimizer = "adamw";    // optim.name: the sharded optimizer wraps either
  std::string schedule = "1f1b";      // parallel.schedule (with pp > 1)
  std::string cp_attention = "ring";  // parallel.cp_attention (with cp > 1)
  int cp_ulysses = 0;                 // parallel.cp_ulysses (with cp_attention hybrid)
};

std::string tag_of(const Case& k) {
  return k.arch + "_dp" + std::to_string(k.dp) + "_cp" + std::to_string(k.cp) + "_tp" +
         std::to_string(k.tp) + "_pp" + std::to_string(k.pp) + (k.sp ? "_sp" : "") + "_z" +
         std::to_string(k.zero_stage) + (k.dropout > 0 ? "_drop" : "") +
         (k.mics > 0 ? "_mics" + std::to_string(k.mics) : "") + "_" + k.precision +
         (k.checkpointing ? "_ckpt" : "") +
         (k.selective.empty() ? "" : "_sel" + std::to_string(k.selective.size())) +
         (k.loss_scale > 0 ? "_ls" + std::to_string(static_cast<int>(std::log2(k.loss_scale)))
                           : "") +
         (k.optimizer != "adamw" ? "_" + k.optimizer : "") +
         (k.schedule != "1f1b" ? "_" + k.schedule : "") +
         (k.cp_attention != "ring" ? "_" + k.cp_attention : "") +
         (k.cp_ulysses > 0 ? "_u" + std::to_string(k.cp_ulysses) : "");
}

// model.recompute (and its list) of the case.
std::string recompute_of(const Case& k) {
  if (!k.selective.empty()) return "selective, recompute_save: \"" + k.selective + "\"";
  return k.checkpointing ? "full" : "none";
}

Config config_for(const Case& k, const std::string& dir, const std::string& out, bool parallel) {
  std::ostringstream y;
  const int n_layer = k.schedule == "zb-v" ? 4 : 2;  // zb-v: 2 stages on each pipeline rank
  if (k.arch == "gpt2") {
    y << "model: {arch: gpt2, vocab_size: 61, vocab_multiple: 32, n_layer: " << n_layer
      << ", n_head: 4, n_embd: "
         "32, max_seq_len: 16, "
         "dropout: "
      << k.dropout << ", recompute: " << recompute_of(k) << "}\n";
  } else {
    // llama_ext: the Hugging Face families' options (Note [Hugging Face families]) — heads of
    // 12 over a width of 32, Llama 3's RoPE scaling over a pre-training context of 8, every
    // bias; qwen2: q, k, v biases; qwen3: q/k norms over heads of 12; mistral: a 5-token
    // sliding window over the 16-token sequences (Note [Sliding window]).
    y << "model: {arch: llama, vocab_size: 61, vocab_multiple: 32, n_layer: " << n_layer
      << ", n_head: 4, "
         "n_kv_head: 2, n_embd: 32, "
         "max_seq_len: 16, tie_embeddings: false, recompute: "
      << recompute_of(k)
      << (k.arch == "llama_ext"
              ? ", head_dim: 12, attention_bias: true, mlp_bias: true, rope_scaling: {type: "
                "llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, "
                "original_max_seq_len: 8}"
              : "")
      << (k.arch == "qwen2" ? ", qkv_bias: true" : "")
      << (k.arch == "qwen3" ? ", head_dim: 12, qk_norm: true" : "")
      << (k.arch == "mistral" ? ", head_dim: 12, sliding_window: 5" : "") << "}\n";
  }
  y << "data: {train: " << dir << "/data/train_*.bin, val: " << dir
    << "/data/train_*.bin, batch_size: " << (parallel ? 4 : 4 * k.dp) << ", seq_len: 16}\n"
    << "optim: {name: " << k.optimizer
    << (k.optimizer == "sgd" ? ", momentum: 0.9, weight_decay: 0.1" : "")
    << ", lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 2, eps: 1.0e-6, grad_clip: 0.5, "
       "grad_accum: 2}\n"
    // A small peak (1e7) so that the printed MFU (0.1 % steps) of a slow split step is not 0.0 %.
    << "train: {steps: 6, peak_flops: 1.0e7, log_every: 100, val_every: 0, val_steps: 2, "
       "sample_every: 0, precision: "
    << k.precision << ", loss_scaling: " << (k.loss_scale > 0 ? "dynamic" : "auto")
    << ", initial_loss_scale: " << (k.loss_scale > 0 ? k.loss_scale : 65536.0)
    << ", out_dir: " << out << "}\n"
    << "checkpoint: {every: 0, keep: 0}\n"
    << "logging: {jsonl: false, tensorboard: false}\n";
  if (parallel) {
    y << "parallel: {dp: " << k.dp << ", pp: " << k.pp << ", cp: " << k.cp << ", tp: " << k.tp
      << ", sequence_parallel: " << (k.sp ? "true" : "false") << ", zero_stage: " << k.zero_stage
      << ", mics_partition_size: " << k.mics << ", schedule: " << k.schedule
      << ", cp_attention: " << k.cp_attention << ", cp_ulysses: " << k.cp_ulysses
      << ", bucket_mb: 0.01}\n";
  }
  return parse_config_text(y.str());
}

// The last step line's "| <ms> ms | <n> tok/s | MFU <m>% |" as {ms, tok/s, MFU %}.
std::array<double, 3> step_line_rates(const std::string& log) {
  const size_t at = log.rfind("\nstep ") == std::string::npos ? 0 : log.rfind("\nstep ") + 1;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  std::array<double, 3> r{};
  const size_t tok = line.find(" tok/s"), mfu = line.find("| MFU ");
  const size_t ms = line.rfind(" ms |", tok);
  if (tok == std::string::npos || mfu == std::string::npos || ms == std::string::npos) return r;
  r[0] = std::stod(line.substr(line.rfind("| ", ms) + 2));
  r[1] = std::stod(line.substr(line.rfind("| ", tok) + 2));
  r[2] = std::stod(line.substr(mfu + 6));
  return r;
}

// Note [Throughput] (train/train_step.cpp): the step line's tok/s counts the whole job's tokens and
// its MFU divides by every rank's peak, so tok/s · step time is the global batch (the single
// process's batch) and MFU · ranks · step time is the single process's MFU · its step time.
void expect_same_throughput_definition(const std::string& split_log, int ranks,
                                       const std::string& single_log) {
  const auto [ms, tok, mfu] = step_line_rates(split_log);
  const auto [ms1, tok1, mfu1] = step_line_rates(single_log);
  ASSERT_GT(ms * tok * mfu * ms1 * tok1 * mfu1, 0) << split_log << single_log;
  // Printed to 0.1 ms, 1 tok/s and 0.1 %: each product is known to within its rounding, so the
  // bound is the two roundings' worst case (a layout that counted tokens or peak per rank would
  // be off by its cp, tp or pp factor, far outside it).
  const auto slack = [](double a, double da, double b, double db) {
    return a * db + b * da + da * db;
  };
  EXPECT_NEAR(tok * ms, tok1 * ms1, slack(tok, 0.5, ms, 0.05) + slack(tok1, 0.5, ms1, 0.05))
      << split_log << single_log;
  EXPECT_NEAR(mfu * ranks * ms, mfu1 * ms1,
              ranks * slack(mfu, 0.05, ms, 0.05) + slack(mfu1, 0.05, ms1, 0.05))
      << split_log << single_log;
}

ParallelContext context_for(const Case& k) {
  ParallelOptions po;
  po.shape = {.dp = k.dp, .pp = k.pp, .cp = k.cp, .tp = k.tp};
  po.mics_partition_size = k.mics;
  po.cp_ulysses = k.cp_ulysses;
  po.comm_timeout_s = testing::kTestCommTimeoutS;
  po.nccl_rules = true;  // every transfer as NCCL runs it (Note [NCCL rules on MPI])
  return ParallelContext::create(po);
}

void expect_matches_single(const Case& k) {
  const int ranks = k.dp * k.cp * k.tp * k.pp;
  if (testing::world_size() != ranks) GTEST_SKIP() << "needs " << ranks << " ranks";
  ParallelContext ctx = context_for(k);
  const std::string dir =
      testing::shared_train_data(ctx, "loom_train_tp_" + std::to_string(ctx.world_size()));
  const std::string tag = tag_of(k);
  std::ostringstream log;
  Trainer split(config_for(k, dir, dir + "/mp_" + tag, true), testing::trainer_options(log, &ctx));
  const auto a = split.run();
  if (ctx.rank() == 0 && (k.tp > 1 || k.cp > 1)) {
    EXPECT_NE(log.str().find("model parallel: tp " + std::to_string(k.tp)), std::string::npos)
        << log.str();
    if (k.cp_attention == "hybrid") {  // the cp group's split, Ulysses × ring
      EXPECT_NE(log.str().find("(hybrid attention: ulysses " + std::to_string(k.cp_ulysses) +
                               " × ring " + std::to_string(k.cp / k.cp_ulysses) + ")"),
                std::string::npos)
          << log.str();
    }
    if (k.mics > 0) {  // sharded inside the partition, replicated across the rest of dp·cp
      EXPECT_NE(log.str().find("shards over mics_partition (" + std::to_string(k.mics) +
                               "), replicas over mics_replica"),
                std::string::npos)
          << log.str();
    }
  }

  std::ostringstream slog;
  Trainer single(
      config_for(k, dir, dir + "/single_" + tag + "_" + std::to_string(ctx.rank()), false),
      testing::trainer_options(slog, nullptr));
  const auto s = single.run();
  ASSERT_EQ(a.size(), s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_NEAR(a[i].loss, s[i].loss, kLossRelTol * std::abs(s[i].loss)) << "step " << i + 1;
    if (!s[i].skipped) {  // an overflowed step's norm is inf or NaN
      EXPECT_NEAR(a[i].grad_norm, s[i].grad_norm, kLossRelTol * s[i].grad_norm) << "step " << i + 1;
    }
    EXPECT_EQ(a[i].skipped, s[i].skipped) << "step " << i + 1;
  }
  if (k.loss_scale > 0x1p128) {  // beyond f32: overflows first, then trains
    EXPECT_TRUE(s.front().skipped && !s.back().skipped) << slog.str();
  }
  if (k.dp == 1) {  // validation (same val batches only at dp 1; collective under cp and pp)
    const double v = split.evaluate(), want = single.evaluate();
    EXPECT_NEAR(v, want, kLossRelTol * std::abs(want));
  }
  if (ctx.rank() == 0) expect_same_throughput_definition(log.str(), ranks, slog.str());
  if (ctx.rank() == 0) {  // exposed communication names each group waited on (Note [Exposed comm])
    const size_t at = log.str().rfind("\nstep ");
    const std::string line = log.str().substr(at + 1, log.str().find('\n', at + 1) - at - 1);
    const size_t from = line.find("| comm exposed ");
    ASSERT_NE(from, std::string::npos) << line;
    const std::string comm = line.substr(from, line.find(" | ", from + 2) - from);
    auto has = [&](const std::string& part) {  // "(tp 1.2 ms, cp …": a part of the breakdown
      return comm.find("(" + part + " ") != std::string::npos ||
             comm.find(", " + part + " ") != std::string::npos;
    };
    EXPECT_EQ(has("tp"), k.tp > 1) << comm;
    EXPECT_EQ(has("cp"), k.cp > 1) << comm;
    EXPECT_EQ(has("pipeline sends"), k.pp > 1) << comm;
    EXPECT_EQ(has("tied exchange and loss"), k.pp > 1) << comm;
  }
  if (ctx.rank() == 0) {  // the start line counts the whole model on every layout
    const std::string whole =
        "model: " + std::string(k.arch == "gpt2" ? "gpt2" : "llama") + ", " +
        std::to_string(loom::count_parameters(config_for(k, dir, "unused", false).model, true)) +
        " parameters (";
    EXPECT_NE(log.str().find(whole), std::string::npos) << log.str();
    EXPECT_NE(slog.str().find(whole), std::string::npos) << slog.str();
    EXPECT_EQ(log.str().find("this rank trains") != std::string::npos, k.tp > 1 || k.pp > 1)
        << log.str();
  }
  testing::expect_same_sampling(split, single);
  const ModelConfig mc = config_for(k, dir, "unused", false).model;
  std::map<std::string, Tensor> ref;
  for (auto& [name, t] : single.parameters()) ref.emplace(name, t);
  // This rank's trained parameters; under ZeRO-3 gathered copies (collective, every rank).
  for (const auto& [name, t] :
       k.zero_stage == 3 ? split.parameters() : split.trained_parameters()) {
    const Tensor want =
        testing::expected_tp_part(name, ref.at(name), mc, ctx.tp_rank(), ctx.tp_size());
    const std::vector<double> x = t.to_vector(), y = want.to_vector();
    ASSERT_EQ(x.size(), y.size()) << name;
    double worst = 0;
    for (size_t j = 0; j < x.size(); ++j) worst = std::max(worst, std::abs(x[j] - y[j]));
    EXPECT_LE(worst, kParamAbsTol) << name;
  }
  ctx.world().barrier();
}

// 3 steps, checkpoint, resume for 3 more: the same losses and parameters as 6 in one go.
void expect_resume_exact(const Case& k) {
  const int ranks = k.dp * k.cp * k.tp * k.pp;
  if (testing::world_size() != ranks) GTEST_SKIP() << "needs " << ranks << " ranks";
  ParallelContext ctx = context_for(k);
  const std::string dir =
      testing::shared_train_data(ctx, "loom_train_tp_" + std::to_string(ctx.world_size()));
  const std::string tag = tag_of(k);
  std::ostringstream l1, l2, l3;
  Trainer whole(config_for(k, dir, dir + "/whole_" + tag, true),
                testing::trainer_options(l1, &ctx));
  const auto w = whole.run();
  const std::string out = dir + "/resumed_" + tag;
  Trainer first(config_for(k, dir, out, true), testing::trainer_options(l2, &ctx, "", 3));
  first.run();
  Trainer second(config_for(k, dir, out, true), testing::trainer_options(l3, &ctx, "latest"));
  const auto r = second.run();
  ASSERT_EQ(r.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r[i].loss, w[3 + i].loss) << "step " << 4 + i;
  const auto pw = whole.parameters(), pr = second.parameters();
  ASSERT_EQ(pw.size(), pr.size());
  for (size_t i = 0; i < pw.size(); ++i)
    EXPECT_EQ(pw[i].second.to_vector(), pr[i].second.to_vector()) << pw[i].first;
  ctx.world().barrier();
}

TEST(TrainModelParallel2, Tp2MatchesSingleProcess) { expect_matches_single({.tp = 2}); }
TEST(TrainModelParallel2, Tp2SequenceParallelLlamaMatchesSingleProcess) {
  expect_matches_single({.arch = "llama", .tp = 2, .sp = true});
}
TEST(TrainModelParallel2, Tp2SequenceParallelLlamaFamilyMatchesSingleProcess) {
  expect_matches_single({.arch = "llama_ext", .tp = 2, .sp = true});
}
TEST(TrainModelParallel2, Cp2LlamaFamilyMatchesSingleProcess) {
  expect_matches_single({.arch = "llama_ext", .cp = 2});
}
TEST(TrainModelParallel2, Tp2Qwen3MatchesSingleProcess) {  // q/k norms over each rank's heads
  expect_matches_single({.arch = "qwen3", .tp = 2});
}
TEST(TrainModelParallel2, Tp2SequenceParallelQwen3MatchesSingleProcess) {
  expect_matches_single({.arch = "qwen3", .tp = 2, .sp = true});
}
TEST(TrainModelParallel2, Cp2Qwen3MatchesSingleProcess) {
  expect_matches_single({.arch = "qwen3", .cp = 2});
}
// Ulysses (Note [Ulysses] in parallel/cp/ulysses.h): the head split; with Mistral's window over
// the whole sequence, which ring attention refuses; with grouped-query heads (Qwen3).
TEST(TrainModelParallel2, Cp2UlyssesMatchesSingleProcess) {
  expect_matches_single({.cp = 2, .dropout = 0.1, .cp_attention = "ulysses"});
}
TEST(TrainModelParallel2, Cp2UlyssesMistralMatchesSingleProcess) {
  expect_matches_single({.arch = "mistral", .cp = 2, .cp_attention = "ulysses"});
}
TEST(TrainModelParallel2, Cp2UlyssesQwen3MatchesSingleProcess) {
  expect_matches_single({.arch = "qwen3", .cp = 2, .cp_attention = "ulysses"});
}
TEST(TrainModelParallel2, Dp2Zero3Qwen2MatchesSingleProcess) {
  expect_matches_single({.arch = "qwen2", .dp = 2, .zero_stage = 3});
}
TEST(TrainModelParallel2, Tp2SequenceParallelMistralMatchesSingleProcess) {
  expect_matches_single({.arch = "mistral", .tp = 2, .sp = true, .checkpointing = true});
}
TEST(TrainModelParallel2, Dp2Zero2MistralMatchesSingleProcess) {
  expect_matches_single({.arch = "mistral", .dp = 2, .zero_stage = 2});
}
TEST(TrainModelParallel2, Tp2WithDropoutMatchesSingleProcess) {
  expect_matches_single({.tp = 2, .dropout = 0.1});
}
// Mixed precision (f32 masters, f64 compute) applies inside the TP layers as in the model's.
TEST(TrainModelParallel2, Tp2SequenceParallelMixedPrecisionMatchesSingleProcess) {
  expect_matches_single({.tp = 2, .sp = true, .precision = "f64"});
}
// Dropout on sequence/context chunks: each rank draws the single-process masks of its rows.
TEST(TrainModelParallel2, Tp2SequenceParallelWithDropoutMatchesSingleProcess) {
  expect_matches_single({.tp = 2, .sp = true, .dropout = 0.1});
}
TEST(TrainModelParallel2, Tp2SequenceParallelWithDropoutAndCheckpointingMatchesSingleProcess) {
  expect_matches_single({.tp = 2, .sp = true, .dropout = 0.1, .checkpointing = true});
}
// Selective recompute (Note [Selective recompute] in core/checkpoint.h): the recomputation runs
// the tensor-parallel collectives and the ring again but not the kept GEMMs or attention.
TEST(TrainModelParallel2, Tp2SequenceParallelSelectiveRecomputeMistralMatchesSingleProcess) {
  expect_matches_single({.arch = "mistral", .tp = 2, .sp = true, .selective = "matmul,attention"});
}
TEST(TrainModelParallel2, Tp2SelectiveRecomputeWithDropoutMatchesSingleProcess) {
  expect_matches_single({.tp = 2, .dropout = 0.1, .selective = "matmul"});
}
TEST(TrainModelParallel2, Cp2SelectiveRecomputeMatchesSingleProcess) {
  expect_matches_single({.cp = 2, .dropout = 0.1, .selective = "matmul,attention"});
  expect_matches_single({.cp = 2, .selective = "matmul"});  // the ring runs again
}
TEST(TrainModelParallel2, Cp2UlyssesSelectiveRecomputeQwen3MatchesSingleProcess) {
  expect_matches_single(
      {.arch = "qwen3", .cp = 2, .selective = "attention", .cp_attention = "ulysses"});
}
// Data parallelism: each replica draws the single-process batch's masks for its rows.
TEST(TrainModelParallel2, Dp2Zero2WithDropoutMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .zero_stage = 2, .dropout = 0.1});
}
// Dynamic loss scaling across ranks (Note [Loss scaling across ranks]): the scaled gradients'
// global norm is unscaled on every rank's device as in the single process. A scale above f32's
// range (2^130) overflows the first steps, so every rank skips them as the single process does
// (expect_matches_single checks some steps are skipped and some are not).
TEST(TrainModelParallel2, Dp2Zero1DynamicLossScalingMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .zero_stage = 1, .loss_scale = 1024});
}
TEST(TrainModelParallel2, Tp2SequenceParallelDynamicLossScalingMatchesSingleProcess) {
  expect_matches_single({.tp = 2, .sp = true, .loss_scale = 0x1p130});
}
TEST(TrainModelParallel2, Cp2WithDropoutMatchesSingleProcess) {
  expect_matches_single({.cp = 2, .dropout = 0.1});
}
TEST(TrainModelParallel2, Cp2MatchesSingleProcess) { expect_matches_single({.cp = 2}); }
// SGD under the data-parallel engine (which also reduces the cp gradients): it used to run AdamW
// whatever optim.name said; the sharded optimizer now wraps SGD as it wraps AdamW.
TEST(TrainModelParallel2, Cp2WithSgdMatchesSingleProcess) {
  expect_matches_single({.cp = 2, .optimizer = "sgd"});
}
TEST(TrainModelParallel2, Dp2Zero2WithSgdMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .zero_stage = 2, .optimizer = "sgd"});
}
TEST(TrainModelParallel2, Tp2ResumeIsExact) { expect_resume_exact({.tp = 2}); }

TEST(TrainModelParallel4, Dp2Tp2Zero3LlamaFamilyMatchesSingleProcess) {
  expect_matches_single({.arch = "llama_ext", .dp = 2, .tp = 2, .zero_stage = 3});
}
// Zero-bubble with tensor (and sequence) parallelism: the W passes hold the tp layers' weight
// GEMMs (Note [Split backward] in core/autograd.h).
TEST(TrainModelParallel4, Tp2Pp2ZeroBubbleH1MatchesSingleProcess) {
  expect_matches_single({.arch = "llama_ext", .tp = 2, .pp = 2, .sp = true, .schedule = "zb-h1"});
}
// ZB-V (Note [ZB-V] in parallel/pp/schedule.h) with tensor and sequence parallelism, and with
// ring context parallelism: 2 chunks of one block each on every pipeline rank.
TEST(TrainModelParallel4, Tp2Pp2ZeroBubbleVMatchesSingleProcess) {
  expect_matches_single({.arch = "llama_ext", .tp = 2, .pp = 2, .sp = true, .schedule = "zb-v"});
  expect_matches_single({.cp = 2, .pp = 2, .dropout = 0.1, .schedule = "zb-v"});
}
// Ulysses with tensor parallelism (a tp rank's one kv head repeated for both cp ranks), with the
// pipeline, and over 4 cp ranks.
TEST(TrainModelParallel4, Cp2Tp2UlyssesSequenceParallelMatchesSingleProcess) {
  expect_matches_single(
      {.arch = "llama_ext", .cp = 2, .tp = 2, .sp = true, .cp_attention = "ulysses"});
}
TEST(TrainModelParallel4, Cp2Pp2UlyssesMatchesSingleProcess) {
  expect_matches_single({.arch = "mistral", .cp = 2, .pp = 2, .cp_attention = "ulysses"});
}
TEST(TrainModelParallel4, Cp4UlyssesMatchesSingleProcess) {
  expect_matches_single({.arch = "llama", .cp = 4, .cp_attention = "ulysses"});
}
// Hybrid (Note [Hybrid context parallelism] in parallel/cp/hybrid.h): Ulysses over 2 ranks
// around a ring of 2, each rank keeping cp4's chunks (so its dropout rows and loss share); with
// dropout, and Llama's grouped-query heads (one kv head per Ulysses rank, two q heads).
TEST(TrainModelParallel4, Cp4HybridU2R2WithDropoutMatchesSingleProcess) {
  expect_matches_single({.cp = 4, .dropout = 0.1, .cp_attention = "hybrid", .cp_ulysses = 2});
}
TEST(TrainModelParallel4, Cp4HybridU2R2LlamaMatchesSingleProcess) {
  expect_matches_single({.arch = "llama", .cp = 4, .cp_attention = "hybrid", .cp_ulysses = 2});
}
// Selective recompute over the hybrid (the kept ring skips both exchanges' ring again) and
// under ZeRO-3 with tensor parallelism (the recomputation gathers the parameters again).
TEST(TrainModelParallel4, Cp4HybridU2R2SelectiveRecomputeMatchesSingleProcess) {
  expect_matches_single({.cp = 4,
                         .dropout = 0.1,
                         .selective = "matmul,attention",
                         .cp_attention = "hybrid",
                         .cp_ulysses = 2});
}
TEST(TrainModelParallel4, Dp2Tp2Zero3SelectiveRecomputeMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .tp = 2, .sp = true, .zero_stage = 3, .selective = "matmul"});
}
TEST(TrainModelParallel4, Dp4Zero3MicsQwen3MatchesSingleProcess) {  // MiCS partitions of 2
  expect_matches_single({.arch = "qwen3", .dp = 4, .zero_stage = 3, .mics = 2});
}
TEST(TrainModelParallel4, Dp2Tp2Zero1MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .tp = 2, .zero_stage = 1});
}
TEST(TrainModelParallel4, Dp2Cp2Zero1LlamaMatchesSingleProcess) {
  expect_matches_single({.arch = "llama", .dp = 2, .cp = 2, .zero_stage = 1});
}
TEST(TrainModelParallel4, Cp2Tp2SequenceParallelMatchesSingleProcess) {
  expect_matches_single({.cp = 2, .tp = 2, .sp = true});
}
TEST(TrainModelParallel4, Cp2Tp2SequenceParallelMixedPrecisionMatchesSingleProcess) {
  expect_matches_single({.cp = 2, .tp = 2, .sp = true, .precision = "f64"});
}
TEST(TrainModelParallel4, Dp2Tp2SequenceParallelZero1WithDropoutMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .tp = 2, .sp = true, .zero_stage = 1, .dropout = 0.1});
}
TEST(TrainModelParallel4, Cp2Tp2SequenceParallelWithDropoutMatchesSingleProcess) {
  expect_matches_single({.cp = 2, .tp = 2, .sp = true, .dropout = 0.1});
}
TEST(TrainModelParallel4, Dp2Tp2Zero3MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .tp = 2, .zero_stage = 3});
}
// MiCS over the dp·cp group (Note [MiCS groups]): partitions of 2 of the 4 ranks (one cp group
// each in the default order), replicas across dp.
TEST(TrainModelParallel4, Dp2Cp2Zero1MicsMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .cp = 2, .zero_stage = 1, .mics = 2});
}
TEST(TrainModelParallel4, Dp2Cp2Zero2MicsMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .cp = 2, .zero_stage = 2, .mics = 2});
}
TEST(TrainModelParallel4, Dp2Cp2Zero3MicsMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .cp = 2, .zero_stage = 3, .mics = 2});
}
TEST(TrainModelParallel4, Dp2Cp2Zero2MicsWithSgdMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .cp = 2, .zero_stage = 2, .mics = 2, .optimizer = "sgd"});
}
TEST(TrainModelParallel4, Dp2Tp2Zero3WithSgdMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .tp = 2, .zero_stage = 3, .optimizer = "sgd"});
}
TEST(TrainModelParallel4, Dp2Pp2Zero1WithSgdMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .pp = 2, .zero_stage = 1, .optimizer = "sgd"});
}
TEST(TrainModelParallel4, Dp2Cp2Zero2SgdResumeIsExact) {  // SGD's momentum shards resume
  expect_resume_exact({.dp = 2, .cp = 2, .zero_stage = 2, .optimizer = "sgd"});
}
TEST(TrainModelParallel4, Dp2Cp2Zero1MicsResumeIsExact) {
  expect_resume_exact({.dp = 2, .cp = 2, .zero_stage = 1, .mics = 2});
}
TEST(TrainModelParallel4, Dp2Cp2Zero1ResumeIsExact) {
  expect_resume_exact({.dp = 2, .cp = 2, .zero_stage = 1});
}

TEST(TrainModelParallel4, Cp4MatchesSingleProcess) { expect_matches_single({.cp = 4}); }
TEST(TrainModelParallel4, Tp2Pp2MatchesSingleProcess) { expect_matches_single({.tp = 2, .pp = 2}); }
TEST(TrainModelParallel4, Dp2Pp2Zero2DynamicLossScalingMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .pp = 2, .zero_stage = 2, .loss_scale = 0x1p130});
}
TEST(TrainModelParallel4, Tp2Pp2DynamicLossScalingMatchesSingleProcess) {
  expect_matches_single({.tp = 2, .pp = 2, .loss_scale = 4096});
}
TEST(TrainModelParallel4, Cp2Pp2WithDropoutMatchesSingleProcess) {
  expect_matches_single({.cp = 2, .pp = 2, .dropout = 0.1});
}
TEST(TrainModelParallel4, Cp2Pp2LlamaMatchesSingleProcess) {
  expect_matches_single({.arch = "llama", .cp = 2, .pp = 2});
}

TEST(TrainModelParallel8, Dp2Tp2Pp2MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .tp = 2, .pp = 2});
}
TEST(TrainModelParallel8, Dp2Tp2Pp2Zero1MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .tp = 2, .pp = 2, .zero_stage = 1});
}
TEST(TrainModelParallel8, Tp2Cp2Pp2SequenceParallelMatchesSingleProcess) {
  expect_matches_single({.cp = 2, .tp = 2, .pp = 2, .sp = true});
}
TEST(TrainModelParallel8, Tp2Cp2Pp2Zero1MatchesSingleProcess) {
  expect_matches_single({.cp = 2, .tp = 2, .pp = 2, .zero_stage = 1});
}
// Sharded gradients/parameters under the pipeline (Note [Sharded stages] in parallel/pp): the
// tied, vocab-parallel wte is synchronised between the first and last stage shard by shard.
TEST(TrainModelParallel8, Dp2Tp2Pp2Zero3SequenceParallelMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .tp = 2, .pp = 2, .sp = true, .zero_stage = 3});
}
TEST(TrainModelParallel8, Tp2Cp2Pp2Zero2MatchesSingleProcess) {
  expect_matches_single({.cp = 2, .tp = 2, .pp = 2, .zero_stage = 2});
}
TEST(TrainModelParallel8, Dp2Cp2Tp2MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .cp = 2, .tp = 2});
}
TEST(TrainModelParallel8, Dp2Cp2Tp2Zero1SequenceParallelMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .cp = 2, .tp = 2, .sp = true, .zero_stage = 1});
}
// Hybrid cp (Note [Hybrid context parallelism]) inside data parallelism, and beside tensor and
// sequence parallelism (a tp rank's 2 heads, one per Ulysses rank): the cp group's split is
// taken within each dp replica and tp group.
TEST(TrainModelParallel8, Dp2Cp4HybridU2R2Zero1LlamaMatchesSingleProcess) {
  expect_matches_single({.arch = "llama",
                         .dp = 2,
                         .cp = 4,
                         .zero_stage = 1,
                         .cp_attention = "hybrid",
                         .cp_ulysses = 2});
}
TEST(TrainModelParallel8, Cp4Tp2HybridU2R2SequenceParallelMatchesSingleProcess) {
  expect_matches_single({.cp = 4, .tp = 2, .sp = true, .cp_attention = "hybrid", .cp_ulysses = 2});
}

}  // namespace
}  // namespace loom::parallel
