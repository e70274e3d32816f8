// tests/train/train_dp_mpi_test.cpp — the trainer under mpirun with parallel.dp = world
// size and ZeRO-1 or ZeRO-3: its losses match the single-process run on the same global batch (to
// f32 rounding), and stopping, resuming from the sharded checkpoint and continuing reproduces the
// uninterrupted data-parallel run bit for bit; the gradient noise scale without accumulation is
// one process's with it.
// loom-mpi-test: ranks 2
// loom-multihost-test: 2x1
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
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

Config config_for(const std::string& dir, const std::string& out, int dp, int64_t batch,
                  int zero_stage = 1) {
  std::ostringstream y;
  y << "model: {arch: gpt2, vocab_size: 64, vocab_multiple: 32, n_layer: 2, n_head: 2, n_embd: 32, "
       "max_seq_len: 16}\n"
    << "data: {train: " << dir << "/data/train_*.bin, batch_size: " << batch << ", seq_len: 16}\n"
    << "optim: {lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 2, eps: 1.0e-6}\n"
    << "train: {steps: 8, peak_flops: 1.0e10, log_every: 100, val_every: 0, sample_every: 0, "
       "out_dir: "
    << out << "}\n"
    << "checkpoint: {every: 0, keep: 0}\n"
    << "logging: {jsonl: false, tensorboard: false}\n"
    << "parallel: {dp: " << dp << ", zero_stage: " << (dp > 1 ? zero_stage : 0)
    << ", bucket_mb: 0.01}\n";
  return parse_config_text(y.str());
}

TEST(TrainDataParallel, ProfileHasComputeAndCommunicationTracks) {
  ParallelOptions po;
  po.shape.dp = testing::world_size();
  ParallelContext ctx = ParallelContext::create(po);
  const std::string dir = testing::shared_train_data(ctx, "loom_train_dp");
  std::ostringstream log;
  TrainerOptions o = testing::trainer_options(log, &ctx);
  o.profile_path = dir + "/trace_rank" + std::to_string(ctx.rank()) + ".json";
  Config cfg = config_for(dir, dir + "/profiled", ctx.dp_size(), 4);
  cfg.train.steps = 2;
  Trainer(cfg, o).run();
  std::ifstream in(o.profile_path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string trace = text.str();
  for (const char* needle :
       {"\"traceEvents\"", "\"compute\"", "\"comm:dp\"", "\"backward\"", "\"all_reduce\""}) {
    EXPECT_NE(trace.find(needle), std::string::npos) << needle;
  }
  ctx.world().barrier();
}

// The newest checkpoint of the run writing into `out`.
std::string checkpoint_dir(const std::string& out) {
  return latest_checkpoint(out + "/checkpoints");
}

void check_matches_and_resumes(int zero_stage) {
  ParallelOptions po;
  po.shape.dp = testing::world_size();
  ParallelContext ctx = ParallelContext::create(po);
  const int dp = ctx.dp_size();
  const std::string dir = testing::shared_train_data(ctx, "loom_train_dp");
  std::ostringstream log;

  const std::string tag = "_z" + std::to_string(zero_stage);
  Trainer full(config_for(dir, dir + "/full" + tag, dp, 4, zero_stage),
               testing::trainer_options(log, &ctx));
  const auto a = full.run();

  std::vector<StepRecord> b;
  {
    Trainer first(config_for(dir, dir + "/split" + tag, dp, 4, zero_stage),
                  testing::trainer_options(log, &ctx, "", 4));
    b = first.run();
  }
  Trainer second(config_for(dir, dir + "/split" + tag, dp, 4, zero_stage),
                 testing::trainer_options(log, &ctx, "latest"));
  const auto rest = second.run();
  b.insert(b.end(), rest.begin(), rest.end());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].loss, b[i].loss) << "step " << i + 1;  // bit-identical after resume
    EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "step " << i + 1;
  }
  const auto pa = full.parameters(), pb = second.parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(pa[i].second.to_vector(), pb[i].second.to_vector()) << pa[i].first;
  if (zero_stage == 3) {  // a single process starts from the per-rank parameter shards
    Config init = config_for(dir, dir + "/init" + tag + "_" + std::to_string(ctx.rank()), 1, 4);
    init.train.init_from = checkpoint_dir(dir + "/full" + tag);
    Trainer from_shards(init, testing::trainer_options(log, nullptr));
    const auto pc = from_shards.parameters();
    ASSERT_EQ(pa.size(), pc.size());
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_EQ(pa[i].second.to_vector(), pc[i].second.to_vector()) << pa[i].first;
  }

  // The same global batch in one process (batch dp·4): same losses up to summation order.
  Trainer single(
      config_for(dir, dir + "/single" + tag + "_" + std::to_string(ctx.rank()), 1, 4 * dp),
      testing::trainer_options(log, nullptr));
  const auto s = single.run();
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_NEAR(a[i].loss, s[i].loss, 1e-5 * std::abs(s[i].loss)) << "step " << i + 1;
  }
  ctx.world().barrier();
}

TEST(TrainDataParallel, MatchesSingleProcessAndResumesExactly) { check_matches_and_resumes(1); }

// train.noise_scale without accumulation (Note [Gradient noise scale] in train/noise_scale.h):
// each rank's gradient before its all-reduce is the small batch. Rank 0's estimate is then the
// one a single process makes accumulating the same global batch in dp micro-batches, whose first
// is rank 0's rows: the same two norms, up to summation order.
TEST(TrainDataParallel, NoiseScaleWithoutAccumulationIsOneProcessAccumulating) {
  ParallelOptions po;
  po.shape.dp = testing::world_size();
  ParallelContext ctx = ParallelContext::create(po);
  const int dp = ctx.dp_size();
  const std::string dir = testing::shared_train_data(ctx, "loom_train_dp");
  std::ostringstream log;
  for (int zero : {0, 1}) {
    const std::string tag = "_z" + std::to_string(zero);
    Config a = config_for(dir, dir + "/noise" + tag, dp, 4, zero);
    a.train.noise_scale = true;
    a.train.steps = 4;
    const auto ra = Trainer(a, testing::trainer_options(log, &ctx)).run();
    Config b =
        config_for(dir, dir + "/noise_single" + tag + "_" + std::to_string(ctx.rank()), 1, 4);
    b.optim.grad_accum = dp;
    b.train.noise_scale = true;
    b.train.steps = 4;
    const auto rb = Trainer(b, testing::trainer_options(log, nullptr)).run();
    ASSERT_EQ(ra.size(), rb.size());
    int compared = 0;
    for (size_t i = 0; i < ra.size(); ++i) {
      EXPECT_NEAR(ra[i].loss, rb[i].loss, 1e-5 * std::abs(rb[i].loss)) << tag << " step " << i + 1;
      if (ctx.rank() != 0) continue;
      // (None while the averaged |G|² is not yet positive: then on both sides.)
      ASSERT_EQ(ra[i].noise_scale.has_value(), rb[i].noise_scale.has_value())
          << tag << " step " << i + 1;
      if (!rb[i].noise_scale) continue;
      EXPECT_NEAR(*ra[i].noise_scale, *rb[i].noise_scale, 1e-3 * std::abs(*rb[i].noise_scale))
          << tag << " step " << i + 1;
      ++compared;
    }
    if (ctx.rank() == 0) {
      EXPECT_GE(compared, 2) << tag;
    }
  }
  ctx.world().barrier();
}
// ZeRO-3: parameters are sharded, so each rank checkpoints its parameter shard and resumes it.
TEST(TrainDataParallel, Zero3MatchesSingleProcessAndResumesExactly) {
  check_matches_and_resumes(3);
}

}  // namespace
}  // namespace loom::parallel
