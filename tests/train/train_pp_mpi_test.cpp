// tests/train/train_pp_mpi_test.cpp — the trainer under mpirun with pipeline parallelism:
// per-step losses, gradient norms and the trained parameters match the single-process run with
// the same global batch (optim.grad_accum = the pipeline's micro-batches); a stop and resume
// from the pipelined checkpoint reproduces the uninterrupted pipelined run bit for bit; the
// validation loss (a forward-only pass through the stages, also run every 3 steps) matches the
// single-process one.
// TrainPipeline2.* runs on 2 ranks (pp2: each schedule, zb-h1 also with the Llama families and
// dropout, zb-v with the Llama families and with measured op costs, vpp2, an explicit layout,
// Llama, resumes),
// TrainPipeline4.* on 4 (pp4 1F1B, zb-h1 and zb-v, dp2·pp2 with ZeRO-1, 2 and 3 — GPT-2's tied
// embedding synchronised shard by shard, vpp2 with ZeRO-3, Llama with ZeRO-2, zb-h1 with ZeRO-1
// and 3 (and ZeRO-1 with measured op costs), zb-v with ZeRO-1 and 3 and pp4 zb-v with measured
// op costs — and the ZeRO-1 and ZeRO-3 resumes); each case skips itself at the other world size.
//
// loom-mpi-test: ranks 2 4
// loom-multihost-test: 2x2 4x1
//
// Tolerance: the pipeline runs the same kernels on the same shapes in the same micro-batch
// order as the single process, so untied models agree to the last bit except where summation
// order differs: the tied wte.weight gradient (lookup and head parts summed per stage, then
// added, instead of interleaved per micro-batch) and, with dp, the data-parallel average. Those
// are f32 rounding differences (~1e-7 relative) that AdamW's normalised update can spread over
// the 6 steps (measured: at most 4.4e-7 on a parameter); we allow 1e-5 relative on losses and
// norms and 5e-6 absolute on parameters (weights are O(0.02-1)), and require the untied Llama
// case to match exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "data/shard.h"
#include "parallel/parallel_context.h"
#include "tests/parallel/mpi_test_util.h"
#include "tests/train/train_test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace loom::parallel {
namespace {
namespace fs = std::filesystem;

constexpr double kLossRelTol = 1e-5;
constexpr double kParamAbsTol = 5e-6;

struct Case {
  std::string arch = "gpt2";
  int dp = 1, pp = 2, vpp = 1;
  std::string schedule = "1f1b";
  std::string layout = "";
  int zero_stage = 0;
  int64_t accum = 4;
  std::string precision = "f32";  // train.precision (f64: f32 masters, f64 compute)
  double dropout = 0.0;           // model.dropout (gpt2)
  bool checkpointing = false;     // model.recompute: full
  std::string selective = "";     // gpt2: model.recompute: selective keeping this list
  int n_layer = 4;                // model.n_layer (pp4 zb-v runs 8 stages)
  std::string costs = "unit";     // parallel.schedule_costs
};

Config config_for(const Case& k, const std::string& dir, const std::string& out, bool parallel,
                  int64_t batch) {
  std::ostringstream y;
  if (k.arch == "gpt2") {
    y << "model: {arch: gpt2, vocab_size: 64, vocab_multiple: 32, n_layer: " << k.n_layer
      << ", n_head: 2, n_embd: 32, max_seq_len: 16, "
         "dropout: "
      << k.dropout << ", recompute: "
      << (!k.selective.empty() ? "selective, recompute_save: \"" + k.selective + "\""
          : k.checkpointing    ? "full"
                               : "none")
      << "}\n";
  } else {
    // llama_ext: the Hugging Face families' options (Note [Hugging Face families]).
    y << "model: {arch: llama, vocab_size: 64, vocab_multiple: 32, n_layer: " << k.n_layer
      << ", n_head: 4, n_kv_head: 2, n_embd: 32, "
         "max_seq_len: 16, tie_embeddings: false"
      << (k.arch == "llama_ext"
              ? ", head_dim: 12, attention_bias: true, mlp_bias: true, rope_scaling: {type: "
                "yarn, factor: 4, original_max_seq_len: 8}"
              : "")
      << "}\n";
  }
  y << "data: {train: " << dir << "/data/train_*.bin, val: " << dir
    << "/data/train_*.bin, batch_size: " << batch << ", seq_len: 16}\n"
    << "optim: {lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 2, eps: 1.0e-6, grad_clip: 0.5, "
       "grad_accum: "
    << k.accum << "}\n"
    << "train: {steps: 6, peak_flops: 1.0e10, log_every: 100, val_every: 3, val_steps: 3, "
       "sample_every: 0, precision: "
    << k.precision << ", out_dir: " << out << "}\n"
    << "checkpoint: {every: 0, keep: 0}\n"
    << "logging: {jsonl: false, tensorboard: false}\n";
  if (parallel) {
    y << "parallel: {dp: " << k.dp << ", pp: " << k.pp << ", vpp: " << k.vpp
      << ", schedule: " << k.schedule << ", zero_stage: " << k.zero_stage
      << ", bucket_mb: 0.01, pp_layout: '" << k.layout << "', schedule_costs: '" << k.costs
      << "'}\n";
  }
  return parse_config_text(y.str());
}

ParallelContext context_for(const Case& k) {
  ParallelOptions po;
  po.shape.dp = k.dp;
  po.shape.pp = k.pp;
  po.comm_timeout_s = testing::kTestCommTimeoutS;
  po.nccl_rules = true;  // every transfer as NCCL runs it (Note [NCCL rules on MPI])
  return ParallelContext::create(po);
}

// Runs the case pipelined and in one process; compares losses, norms and this rank's trained
// parameters.
void expect_matches_single(const Case& k, bool exact = false) {
  const int ranks = k.dp * k.pp;
  if (testing::world_size() != ranks) GTEST_SKIP() << "needs " << ranks << " ranks";
  ParallelContext ctx = context_for(k);
  const std::string dir =
      testing::shared_train_data(ctx, "loom_train_pp_" + std::to_string(ctx.world_size()));
  std::string layout = k.layout;
  std::replace(layout.begin(), layout.end(), ',', '-');
  const std::string tag = k.arch + "_" + k.schedule + "_pp" + std::to_string(k.pp) + "_v" +
                          std::to_string(k.vpp) + "_dp" + std::to_string(k.dp) + "_z" +
                          std::to_string(k.zero_stage) + "_" + k.precision +
                          (k.dropout > 0 ? "_drop" : "") + (k.checkpointing ? "_ckpt" : "") +
                          (k.n_layer != 4 ? "_l" + std::to_string(k.n_layer) : "") + "_" + layout;
  std::ostringstream log;
  Trainer piped(config_for(k, dir, dir + "/pp_" + tag, true, 4),
                testing::trainer_options(log, &ctx));
  const auto a = piped.run();
  if (ctx.rank() == 0) {
    EXPECT_NE(log.str().find("pipeline: " + k.schedule), std::string::npos) << log.str();
    EXPECT_NE(log.str().find("step 3 | val loss "), std::string::npos) << log.str();
    EXPECT_NE(log.str().find("step 6 | val loss "), std::string::npos) << log.str();
  }
  const double piped_val = piped.evaluate();  // collective over the pp group

  std::ostringstream slog;
  Trainer single(config_for(k, dir, dir + "/single_" + tag + "_" + std::to_string(ctx.rank()),
                            false, 4 * k.dp),
                 testing::trainer_options(slog, nullptr));
  const auto s = single.run();
  EXPECT_EQ(a.size(), s.size());
  for (size_t i = 0; i < std::min(a.size(), s.size()); ++i) {
    if (exact) {
      EXPECT_EQ(a[i].loss, s[i].loss) << "step " << i + 1;
    } else {
      EXPECT_NEAR(a[i].loss, s[i].loss, kLossRelTol * std::abs(s[i].loss)) << "step " << i + 1;
      EXPECT_NEAR(a[i].grad_norm, s[i].grad_norm, kLossRelTol * s[i].grad_norm) << "step " << i + 1;
    }
  }
  testing::expect_same_sampling(piped, single);
  // Validation (a forward-only pass through the stages): the single process reads the same
  // validation batches only at dp 1 (its batch is dp times larger otherwise).
  if (k.dp == 1) {
    const double want = single.evaluate();
    if (exact) {
      EXPECT_EQ(piped_val, want);
    } else {
      EXPECT_NEAR(piped_val, want, kLossRelTol * std::abs(want));
    }
  }
  // ZeRO-3 holds shards only: parameters() gathers this stage's parameters (collective).
  const auto mine = k.zero_stage == 3 ? piped.parameters() : piped.trained_parameters();
  EXPECT_FALSE(mine.empty());
  if (k.zero_stage == 3) {
    EXPECT_EQ(mine.size(), piped.trained_parameters().size());
  } else {
    // The other stages' weights are released (Note [Pipeline model memory]): one shared element.
    std::set<std::string> trained_names;
    for (const auto& [name, t] : mine) trained_names.insert(name);
    size_t released = 0;
    for (const auto& [name, t] : piped.parameters()) {
      if (trained_names.count(name)) continue;
      ++released;
      EXPECT_EQ(t.strides(), Shape(t.strides().size(), 0)) << name << " is not released";
    }
    EXPECT_GT(released, 0u);
  }
  std::map<std::string, Tensor> ref;
  for (auto& [name, t] : single.parameters()) ref.emplace(name, t);
  for (const auto& [name, t] : mine) {
    const std::vector<double> x = t.to_vector(), y = ref.at(name).to_vector();
    ASSERT_EQ(x.size(), y.size()) << name;
    double worst = 0;
    for (size_t j = 0; j < x.size(); ++j) worst = std::max(worst, std::abs(x[j] - y[j]));
    if (exact) {
      EXPECT_EQ(worst, 0.0) << name;
    } else {
      EXPECT_LE(worst, kParamAbsTol) << name;
    }
  }
  ctx.world().barrier();
}

TEST(TrainPipeline2, GpipeMatchesSingleProcess) { expect_matches_single({.schedule = "gpipe"}); }
TEST(TrainPipeline2, OneFOneBMatchesSingleProcess) { expect_matches_single({}); }
TEST(TrainPipeline2, InterleavedMatchesSingleProcess) {
  expect_matches_single({.schedule = "interleaved"});
}
TEST(TrainPipeline2, InterleavedVpp2MatchesSingleProcess) {
  expect_matches_single({.vpp = 2, .schedule = "interleaved"});
}
TEST(TrainPipeline2, ExplicitLayoutMatchesSingleProcess) {
  expect_matches_single({.layout = "3,1"});
}
TEST(TrainPipeline2, LlamaMatchesSingleProcessExactly) {
  expect_matches_single({.arch = "llama"}, true);
}
TEST(TrainPipeline2, LlamaFamilyMatchesSingleProcessExactly) {
  expect_matches_single({.arch = "llama_ext"}, true);
}

// Zero-bubble (Note [ZB-H1] in parallel/pp/schedule.h): B and W split per micro-batch (Note
// [Split backward] in core/autograd.h) computes every gradient with the same kernels, so the
// untied Llama still matches exactly.
TEST(TrainPipeline2, ZeroBubbleH1MatchesSingleProcess) {
  expect_matches_single({.schedule = "zb-h1"});
}
TEST(TrainPipeline2, ZeroBubbleH1LlamaFamilyMatchesSingleProcessExactly) {
  expect_matches_single({.arch = "llama_ext", .schedule = "zb-h1"}, true);
}
TEST(TrainPipeline2, ZeroBubbleH1WithDropoutMatchesSingleProcess) {
  expect_matches_single({.schedule = "zb-h1", .dropout = 0.1});
}
// A recomputed block is a partial node (Note [Split backward] in core/autograd.h): B recomputes
// it and computes its input's gradient, W its parameters'.
TEST(TrainPipeline2, ZeroBubbleH1WithCheckpointingMatchesSingleProcess) {
  expect_matches_single({.schedule = "zb-h1", .dropout = 0.1, .checkpointing = true});
  expect_matches_single({.schedule = "zb-v", .dropout = 0.1, .checkpointing = true});
  expect_matches_single({.schedule = "zb-v", .selective = "attention"});
}
// Zero-bubble V (Note [ZB-V] in parallel/pp/schedule.h; parallel.vpp left at 1 becomes 2): rank 0
// holds the first and the last stage, so the loss, the validation loss and the sampled head row
// come from rank 0, and GPT-2's tied table is one tensor there (no exchange). Each parameter's
// W passes still run in micro-batch order, so the untied Llama matches exactly.
TEST(TrainPipeline2, ZeroBubbleVMatchesSingleProcess) {
  expect_matches_single({.schedule = "zb-v"});
}
TEST(TrainPipeline2, ZeroBubbleVLlamaFamilyMatchesSingleProcessExactly) {
  expect_matches_single({.arch = "llama_ext", .schedule = "zb-v"}, true);
}
// parallel.schedule_costs: measured (Note [Schedule costs] in parallel/pp/schedule.h): from the
// second step on, the lists are built at the first step's op times; each parameter's W passes
// still run in micro-batch order.
TEST(TrainPipeline2, ZeroBubbleVMeasuredCostsMatchesSingleProcess) {
  expect_matches_single({.schedule = "zb-v", .costs = "measured"});
}

// Dropout (Note [Dropout by coordinates] in layers/dropout_key.h): every stage draws the
// single-process masks of its blocks.
TEST(TrainPipeline2, DropoutMatchesSingleProcess) { expect_matches_single({.dropout = 0.1}); }
TEST(TrainPipeline2, InterleavedVpp2DropoutWithCheckpointingMatchesSingleProcess) {
  expect_matches_single(
      {.vpp = 2, .schedule = "interleaved", .dropout = 0.1, .checkpointing = true});
}

// Selective recompute (Note [Selective recompute] in core/checkpoint.h) in every stage: each
// list, under 1F1B and zb-h1 (a recomputed block is one node; its kept GEMM results feed B).
TEST(TrainPipeline2, SelectiveRecomputeMatchesSingleProcess) {
  expect_matches_single({.dropout = 0.1, .selective = "matmul,attention"});
  expect_matches_single({.schedule = "zb-h1", .dropout = 0.1, .selective = "matmul"});
  expect_matches_single(
      {.vpp = 2, .schedule = "interleaved", .dropout = 0.1, .selective = "attention"});
}

// Mixed precision (f32 masters, f64 compute): the activations crossing stages are f64.
TEST(TrainPipeline2, MixedPrecisionMatchesSingleProcess) {
  expect_matches_single({.precision = "f64"});
}

// 3 steps, a checkpoint, a resume and 3 more equal 6 uninterrupted steps bit for bit.
void expect_resumes_exactly(const Case& k) {
  const int ranks = k.dp * k.pp;
  if (testing::world_size() != ranks) GTEST_SKIP() << "needs " << ranks << " ranks";
  ParallelContext ctx = context_for(k);
  const std::string dir =
      testing::shared_train_data(ctx, "loom_train_pp_" + std::to_string(ctx.world_size()));
  std::ostringstream log;
  Trainer full(config_for(k, dir, dir + "/resume_full_dp" + std::to_string(k.dp), true, 4),
               testing::trainer_options(log, &ctx));
  const auto a = full.run();
  std::vector<StepRecord> b;
  {
    Trainer first(config_for(k, dir, dir + "/resume_split_dp" + std::to_string(k.dp), true, 4),
                  testing::trainer_options(log, &ctx, "", 3));
    b = first.run();
  }
  Trainer second(config_for(k, dir, dir + "/resume_split_dp" + std::to_string(k.dp), true, 4),
                 testing::trainer_options(log, &ctx, "latest"));
  const auto rest = second.run();
  b.insert(b.end(), rest.begin(), rest.end());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].loss, b[i].loss) << "step " << i + 1;
    EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "step " << i + 1;
  }
  const auto pa = k.zero_stage == 3 ? full.parameters() : full.trained_parameters();
  const auto pb = k.zero_stage == 3 ? second.parameters() : second.trained_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(testing::same_bits(pa[i].second, pb[i].second)) << pa[i].first;
  if (k.zero_stage == 3) {  // one process starts from the stages' parameter shards (init_from)
    Config init = config_for(k, dir, dir + "/init_" + std::to_string(ctx.rank()), false, 4 * k.dp);
    init.train.init_from =
        latest_checkpoint(dir + "/resume_full_dp" + std::to_string(k.dp) + "/checkpoints");
    Trainer from_shards(init, testing::trainer_options(log, nullptr));
    std::map<std::string, Tensor> loaded;
    for (auto& [name, t] : from_shards.parameters()) loaded.emplace(name, t);
    for (const auto& [name, t] : pa) EXPECT_TRUE(testing::same_bits(t, loaded.at(name))) << name;
  }
  ctx.world().barrier();
}

TEST(TrainPipeline2, ResumesExactly) { expect_resumes_exactly({}); }
TEST(TrainPipeline2, ZeroBubbleH1ResumesExactly) { expect_resumes_exactly({.schedule = "zb-h1"}); }
TEST(TrainPipeline2, ZeroBubbleVResumesExactly) { expect_resumes_exactly({.schedule = "zb-v"}); }

TEST(TrainPipeline4, OneFOneBMatchesSingleProcess) { expect_matches_single({.pp = 4}); }
TEST(TrainPipeline4, DataAndPipelineMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .zero_stage = 1});
}
TEST(TrainPipeline4, DataAndPipelineWithDropoutMatchesSingleProcess) {
  expect_matches_single({.dp = 2, .zero_stage = 1, .dropout = 0.1});
}
TEST(TrainPipeline4, DataAndPipelineResumesExactly) {
  expect_resumes_exactly({.dp = 2, .zero_stage = 1});
}
// Sharded gradients (and parameters) under the pipeline, Note [Sharded stages]: the tied
// embedding is synchronised shard by shard and the norm summed from the owned shards.
TEST(TrainPipeline4, DataAndPipelineZero2MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .zero_stage = 2});
}
TEST(TrainPipeline4, DataAndPipelineZero3MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .zero_stage = 3});
}
TEST(TrainPipeline4, DataAndInterleavedPipelineZero3MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .vpp = 2, .schedule = "interleaved", .zero_stage = 3});
}
TEST(TrainPipeline4, DataAndPipelineZero2LlamaMatchesSingleProcess) {
  expect_matches_single({.arch = "llama", .dp = 2, .schedule = "gpipe", .zero_stage = 2});
}
TEST(TrainPipeline4, ZeroBubbleH1MatchesSingleProcess) {
  expect_matches_single({.pp = 4, .schedule = "zb-h1"});
}
// The W passes fire data parallelism's hooks: the buckets' reductions launch from the last one.
TEST(TrainPipeline4, DataAndZeroBubbleH1Zero1MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .schedule = "zb-h1", .zero_stage = 1});
}
TEST(TrainPipeline4, DataAndZeroBubbleH1Zero3MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .schedule = "zb-h1", .zero_stage = 3});
}
// Selective recompute with ZeRO-3: the recomputation gathers each block's parameters again.
TEST(TrainPipeline4, Dp2Pp2Zero3SelectiveRecomputeMatchesSingleProcess) {
  expect_matches_single(
      {.dp = 2, .zero_stage = 3, .dropout = 0.1, .selective = "matmul,attention"});
}
TEST(TrainPipeline4, ZeroBubbleVMatchesSingleProcess) {
  expect_matches_single({.pp = 4, .schedule = "zb-v", .n_layer = 8});
}
TEST(TrainPipeline4, ZeroBubbleVMeasuredCostsMatchesSingleProcess) {
  expect_matches_single({.pp = 4, .schedule = "zb-v", .n_layer = 8, .costs = "measured"});
}
// Both data-parallel replicas build the same lists: the measured costs are agreed over the world
// (their buckets' reductions launch from the same last W).
TEST(TrainPipeline4, DataAndZeroBubbleHMeasuredCostsZero1MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .schedule = "zb-h1", .zero_stage = 1, .costs = "measured"});
}
TEST(TrainPipeline4, DataAndZeroBubbleVZero1MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .schedule = "zb-v", .zero_stage = 1});
}
// ZeRO-3's gathers per unit under the V: rank 0's units are the embeddings, its first and its
// last blocks and the head (Note [Sharded stages] in parallel/pp/pipeline.h).
TEST(TrainPipeline4, DataAndZeroBubbleVZero3MatchesSingleProcess) {
  expect_matches_single({.dp = 2, .schedule = "zb-v", .zero_stage = 3});
}
TEST(TrainPipeline4, DataAndPipelineZero3ResumesExactly) {
  expect_resumes_exactly({.dp = 2, .zero_stage = 3});
}

}  // namespace
}  // namespace loom::parallel
