// tests/train/train_packed_mpi_test.cpp — variable-length post-training across layouts: packed
// documents (data.packing) with load balancing, trained by one process and by dp 2 and 4 with
// DDP, ZeRO-3 with collectives (ranks pad to equal micro-batch counts), ODC (ranks run their own
// counts) and MiCS 2-of-4 with both; the same global minibatch of documents each step, so the
// losses, gradient norms and final parameters equal the single process's to f32 rounding (Note
// [Packed loss] in train/step_runner.h: the loss is normalised by the step's loss tokens,
// whatever the split); and cp 2 with Ulysses attention (alone, with the Llama families' window,
// and with dp 2). Also: an ODC run stopped and resumed continues exactly, and ZeRO-3 and ODC
// resume each other's checkpoints.
//
// loom-mpi-test: ranks 2 4
// loom-multihost-test: 2x2
//
// Tolerance as in tests/train/train_reshard_mpi_test.cpp: the layouts sum the same terms in
// other orders (packing into other rows, dp's average, one-sided sums): f32 rounding, spread by
// AdamW; 2e-5 relative on losses and norms, 2e-5 absolute on parameters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "data/packed_loader.h"
#include "parallel/parallel_context.h"
#include "tests/parallel/mpi_test_util.h"
#include "tests/train/train_test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace loom::parallel {
namespace {

constexpr double kRelTol = 2e-5;
constexpr double kParamAbsTol = 2e-5;

struct Layout {
  std::string name;
  int dp = 1;
  int cp = 1;  // context parallelism, with Ulysses attention (packed rows: Note [Packed loss])
  int zero_stage = 0;
  int mics = 0;
  bool odc = false;
  bool deterministic = false;  // parallel.odc_deterministic
  std::string balance = "flops";
  // A Llama in the Hugging Face families' options (Note [Hugging Face families]): heads of 12
  // over a width of 32, Llama 3's RoPE scaling, every bias, and a 7-token sliding window inside
  // the packed documents.
  bool llama = false;
  std::string recompute = "none";  // model.recompute (selective: the default list)
};

// 16 documents per step (batch_size × dp), micro-batches of at most 40 tokens.
Config config_for(const Layout& l, const std::string& data, const std::string& out) {
  std::ostringstream y;
  if (l.llama) {
    y << "model: {arch: llama, vocab_size: 64, vocab_multiple: 32, n_layer: 2, n_head: 2, "
         "n_kv_head: 1, n_embd: 32, head_dim: 12, max_seq_len: 48, attention_bias: true, "
         "mlp_bias: true, rope_scaling: {type: llama3, factor: 8, low_freq_factor: 1, "
         "high_freq_factor: 4, original_max_seq_len: 16}, sliding_window: 7, recompute: "
      << l.recompute << "}\n";
  } else {
    y << "model: {arch: gpt2, vocab_size: 64, vocab_multiple: 32, n_layer: 2, n_head: 2, n_embd: "
         "32, max_seq_len: 48, recompute: "
      << l.recompute << "}\n";
  }
  y << "data: {train: " << data << "/train_*.bin, val: " << data
    << "/val_*.bin, batch_size: " << 16 / l.dp
    << ", seq_len: 40, packing: true, max_tokens_per_microbatch: 40, balance: " << l.balance
    << "}\n"
    << "optim: {lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 2, eps: 1.0e-6, grad_clip: 0.5}\n"
    << "train: {steps: 6, peak_flops: 1.0e10, log_every: 100, val_every: 6, val_steps: 2, "
       "sample_every: 0, out_dir: "
    << out << "}\n"
    << "checkpoint: {every: 3, keep: 0}\n"
    << "logging: {jsonl: false, tensorboard: false}\n";
  if (l.dp > 1 || l.cp > 1) {
    y << "parallel: {dp: " << l.dp << ", cp: " << l.cp << ", cp_attention: ulysses"
      << ", zero_stage: " << l.zero_stage << ", mics_partition_size: " << l.mics
      << ", odc: " << (l.odc ? "true" : "false")
      << ", odc_deterministic: " << (l.deterministic ? "true" : "false") << ", bucket_mb: 0.01}\n";
  }
  return parse_config_text(y.str());
}

std::unique_ptr<ParallelContext> context_for(const Layout& l) {
  ParallelOptions po;
  po.shape = {.dp = l.dp, .cp = l.cp};
  po.mics_partition_size = l.mics;
  po.comm_timeout_s = testing::kTestCommTimeoutS;
  return std::make_unique<ParallelContext>(ParallelContext::create(po));
}

struct Single {
  std::string data, final_checkpoint;
  std::vector<StepRecord> records;
  double val = 0;
};

const Single& single_run(bool llama = false);

// The one-process run of the GPT-2 (or the Llama) model, once per test binary (collective). The
// Llama's reuses the GPT-2 run's data: preparing it again would remove the folder both runs'
// checkpoints are in.
Single make_single(bool llama) {
  Single x;
  auto ctx = context_for(Layout{.name = "world", .dp = testing::world_size()});
  x.data = llama ? single_run().data : testing::shared_sft_data(ctx.get(), "loom_train_packed");
  const std::string out =
      x.data + "/../single_" + (llama ? "llama_" : "") + std::to_string(ctx->rank());
  std::ostringstream log;
  Trainer t(config_for(Layout{.name = "single", .llama = llama}, x.data, out),
            testing::trainer_options(log, nullptr));
  x.records = t.run();
  x.val = t.evaluate();
  x.final_checkpoint = latest_checkpoint(out + "/checkpoints");
  ctx->world().barrier();
  return x;
}

const Single& single_run(bool llama) {
  if (llama) {
    static const Single s = make_single(true);
    return s;
  }
  static const Single s = make_single(false);
  return s;
}

void expect_matches_single(const Layout& l, const std::vector<StepRecord>& got,
                           const Single& want) {
  ASSERT_EQ(got.size(), want.records.size()) << l.name;
  for (size_t i = 0; i < got.size(); ++i) {
    const StepRecord &a = got[i], &b = want.records[i];
    EXPECT_NEAR(a.loss, b.loss, kRelTol * std::abs(b.loss)) << l.name << " step " << a.step;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, kRelTol * b.grad_norm) << l.name << " step " << a.step;
  }
}

void run_layout(const Layout& l) {
  if (testing::world_size() != l.dp * l.cp)
    GTEST_SKIP() << l.name << " runs on " << l.dp * l.cp << " ranks";
  const Single& want = single_run(l.llama);
  auto ctx = context_for(l);
  const std::string out = want.data + "/../" + l.name;
  std::ostringstream log;
  Trainer t(config_for(l, want.data, out), testing::trainer_options(log, ctx.get()));
  const std::vector<StepRecord> got = t.run();
  expect_matches_single(l, got, want);
  const double val = t.evaluate();
  EXPECT_NEAR(val, want.val, kRelTol * want.val) << l.name;
  ctx->world().barrier();
  if (ctx->rank() == 0)
    testing::expect_close_checkpoints(latest_checkpoint(out + "/checkpoints"),
                                      want.final_checkpoint, kParamAbsTol);
  ctx->world().barrier();
}

TEST(TrainPacked, LossIsTheSingleProcessLossAndLearns) {
  const Single& s = single_run();
  ASSERT_EQ(s.records.size(), 6u);
  EXPECT_LT(s.records.back().loss, s.records.front().loss);
  EXPECT_TRUE(std::isfinite(s.val));
}

// What the layouts are checked on: steps whose ranks run different numbers of micro-batches
// (ODC and DDP run them so; ZeRO-3 with collectives pads) — with the runs' own split, in order
// (dp 2 and 4) and balanced (dp 4).
TEST(TrainPacked, RanksGetUnequalMicroBatchCounts) {
  const Single& want = single_run();
  for (auto [dp, balance] : {std::pair{2, BalanceMode::kNone}, std::pair{4, BalanceMode::kNone},
                             std::pair{4, BalanceMode::kFlops}}) {
    PackingOptions o;
    o.docs_per_rank = 16 / dp;
    o.max_len = 40;
    o.max_tokens = 40;
    o.balance = balance;
    o.cost = {1.0, 100.0};
    o.world_size = dp;
    PackedLoader loader({want.data + "/train_000000.bin"}, o);
    int unequal = 0;
    for (int step = 0; step < 6; ++step) {
      const std::vector<int64_t> counts = loader.next().rank_micro_batches;
      unequal += *std::max_element(counts.begin(), counts.end()) !=
                 *std::min_element(counts.begin(), counts.end());
    }
    EXPECT_GE(unequal, 1) << "dp " << dp << " balance " << balance_mode_name(balance);
  }
}

TEST(TrainPacked, Ddp2UnevenMicroBatches) { run_layout({.name = "ddp2", .dp = 2}); }
TEST(TrainPacked, Ddp2InOrderSplit) {
  run_layout({.name = "ddp2_none", .dp = 2, .balance = "none"});
}
// Packed rows under context parallelism with Ulysses attention: each rank keeps its chunks of
// the row padded to 2·cp tokens, attention sees the whole row's documents (and the Llama's
// window) after the head split.
TEST(TrainPacked, UlyssesCp2) { run_layout({.name = "ulysses_cp2", .cp = 2}); }
TEST(TrainPacked, UlyssesCp2LlamaFamily) {
  run_layout({.name = "ulysses_cp2_llama", .cp = 2, .llama = true});
}
TEST(TrainPacked, UlyssesCp2Dp2Zero1) {
  run_layout({.name = "ulysses_cp2_dp2", .dp = 2, .cp = 2, .zero_stage = 1});
}
TEST(TrainPacked, Zero3Collectives2) { run_layout({.name = "z3_2", .dp = 2, .zero_stage = 3}); }
TEST(TrainPacked, Odc2) { run_layout({.name = "odc2", .dp = 2, .zero_stage = 3, .odc = true}); }
TEST(TrainPacked, Odc2LlamaFamily) {
  run_layout({.name = "odc2_llama", .dp = 2, .zero_stage = 3, .odc = true, .llama = true});
}
// Selective recompute (Note [Selective recompute] in core/checkpoint.h) under ODC's one-sided
// gathers, with packed documents and the window.
TEST(TrainPacked, Odc2LlamaFamilySelectiveRecompute) {
  run_layout({.name = "odc2_llama_sel",
              .dp = 2,
              .zero_stage = 3,
              .odc = true,
              .llama = true,
              .recompute = "selective"});
}
TEST(TrainPacked, Odc2InOrderSplit) {
  run_layout({.name = "odc2_none", .dp = 2, .zero_stage = 3, .odc = true, .balance = "none"});
}
TEST(TrainPacked, Zero3Collectives4InOrderSplit) {
  run_layout({.name = "z3_4_none", .dp = 4, .zero_stage = 3, .balance = "none"});
}
TEST(TrainPacked, Odc4InOrderSplit) {
  run_layout({.name = "odc4_none", .dp = 4, .zero_stage = 3, .odc = true, .balance = "none"});
}
TEST(TrainPacked, Zero3Collectives4) { run_layout({.name = "z3_4", .dp = 4, .zero_stage = 3}); }
TEST(TrainPacked, Odc4) { run_layout({.name = "odc4", .dp = 4, .zero_stage = 3, .odc = true}); }
TEST(TrainPacked, Zero3Mics2of4) {
  run_layout({.name = "z3_mics", .dp = 4, .zero_stage = 3, .mics = 2});
}
TEST(TrainPacked, OdcMics2of4) {
  run_layout({.name = "odc_mics", .dp = 4, .zero_stage = 3, .mics = 2, .odc = true});
}

// An ODC run stopped at step 3 and resumed gives the uninterrupted ODC run's steps 4-6 exactly
// (in the deterministic mode: the default adds gradient pieces in arrival order).
TEST(TrainPacked, OdcResumesExactly) {
  const Layout l{.name = "odc_resume",
                 .dp = testing::world_size(),
                 .zero_stage = 3,
                 .odc = true,
                 .deterministic = true};
  const Single& want = single_run();
  auto ctx = context_for(l);
  const std::string base = want.data + "/../" + l.name;
  std::ostringstream log;
  std::vector<StepRecord> whole, resumed;
  {
    Trainer t(config_for(l, want.data, base + "_whole"), testing::trainer_options(log, ctx.get()));
    whole = t.run();
  }
  {
    Trainer t(config_for(l, want.data, base), testing::trainer_options(log, ctx.get(), "", 3));
    t.run();
  }
  {
    Trainer t(config_for(l, want.data, base), testing::trainer_options(log, ctx.get(), "latest"));
    resumed = t.run();
  }
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed[i].step, whole[i + 3].step);
    EXPECT_EQ(resumed[i].loss, whole[i + 3].loss) << "step " << resumed[i].step;
    EXPECT_EQ(resumed[i].grad_norm, whole[i + 3].grad_norm) << "step " << resumed[i].step;
  }
}

// A ZeRO-3 (collectives) run stopped at step 3 resumes under ODC, and an ODC run's checkpoint
// under ZeRO-3: the same owned pieces, so both continue with the single process's steps 4-6 and
// end at its parameters.
TEST(TrainPacked, Zero3AndOdcResumeEachOther) {
  const Single& want = single_run();
  const int n = testing::world_size();
  const Layout z3{.name = "z3_then_odc", .dp = n, .zero_stage = 3};
  const Layout odc{.name = "odc_then_z3", .dp = n, .zero_stage = 3, .odc = true};
  for (const auto& [first, second] : {std::pair{z3, odc}, std::pair{odc, z3}}) {
    auto ctx = context_for(first);
    const std::string out = want.data + "/../" + first.name;
    std::ostringstream log;
    {
      Trainer t(config_for(first, want.data, out), testing::trainer_options(log, ctx.get(), "", 3));
      t.run();
    }
    Trainer t(config_for(second, want.data, out),
              testing::trainer_options(log, ctx.get(), "latest"));
    const std::vector<StepRecord> got = t.run();
    ASSERT_EQ(got.size(), 3u) << first.name;
    for (size_t i = 0; i < 3; ++i) {
      const StepRecord& b = want.records[i + 3];
      EXPECT_EQ(got[i].step, b.step);
      EXPECT_NEAR(got[i].loss, b.loss, kRelTol * std::abs(b.loss)) << first.name << " " << b.step;
      EXPECT_NEAR(got[i].grad_norm, b.grad_norm, kRelTol * b.grad_norm) << first.name;
    }
    ctx->world().barrier();
    if (ctx->rank() == 0) {
      testing::expect_close_checkpoints(latest_checkpoint(out + "/checkpoints"),
                                        want.final_checkpoint, kParamAbsTol);
    }
    ctx->world().barrier();
  }
}

}  // namespace
}  // namespace loom::parallel
