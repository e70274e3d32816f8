// tests/train/train_dp_mpi_test.cpp — the trainer under mpirun with parallel.dp = world
// size and ZeRO-1 or ZeRO-3: its losses match the single-process run on the same global batch (to
// f32 rounding), and stopping, resuming from the sharded checkpoint and continuing reproduces the
// uninterrupted data-parallel run bit for bit.
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
// ZeRO-3: parameters are sharded, so each rank checkpoints its parameter shard and resumes it.
TEST(TrainDataParallel, Zero3MatchesSingleProcessAndResumesExactly) {
  check_matches_and_resumes(3);
}

}  // namespace
}  // namespace loom::parallel
