// tests/train/train_reshard_mpi_test.cpp — checkpoints that follow the user to another layout:
// a run trained 3 steps at tp2·pp2 stops with a checkpoint; runs at other layouts resume from it
// — dp4 with ZeRO-2, dp2·pp2 interleaved (vpp 2) with ZeRO-1, pp4 interleaved (vpp 2: eight
// one-block chunks), dp2·cp2 with ZeRO-3 and MiCS
// (partitions of 2), and one process — and each continues with the losses and gradient norms of
// the uninterrupted single-process run, ending at its parameters; the global batch (8
// sequences) is the same in every layout, so the data continues exactly too. Each resumed run
// also writes its final checkpoint from its own layout (asynchronously), which rank 0 reads
// whole and compares.
// Also: train.init_from of the tp2·pp2 checkpoint in a tp2·dp2 run (and of its Hugging Face
// export), and a changed model refused on resume with the key named.
// loom-mpi-test: ranks 4
// loom-multihost-test: 2x2
//
// Tolerance: each layout sums the same terms in another order (tp's split GEMMs, cp's ring
// merge, dp's average, the pipeline's tied-gradient exchange): f32 rounding, ~1e-7 relative per
// step, which AdamW's normalised update spreads over the remaining steps. We allow 2e-5
// relative on losses and norms and 2e-5 absolute on parameters (weights are O(0.02-1)), the
// bounds the layout equivalence tests use for 6 steps from scratch.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "parallel/parallel_context.h"
#include "tests/parallel/mpi_test_util.h"
#include "tests/train/train_test_util.h"
#include "train/checkpoint.h"
#include "train/convert.h"
#include "train/trainer.h"

namespace loom::parallel {
namespace {
namespace fs = std::filesystem;

constexpr double kRelTol = 2e-5;
constexpr double kParamAbsTol = 2e-5;

struct Layout {
  std::string name;
  int dp = 1, pp = 1, cp = 1, tp = 1, vpp = 1;
  int zero_stage = 0;
  int mics = 0;
  int64_t batch = 8, accum = 1;  // batch × dp × accum = 8 sequences per step
  int64_t global = 0;            // > 0: data.global_batch instead of grad_accum
  std::string schedule = "1f1b";
};

Config config_for(const Layout& l, const std::string& dir, const std::string& out) {
  std::ostringstream y;
  y << "model: {arch: gpt2, vocab_size: 64, vocab_multiple: 32, n_layer: 8, n_head: 2, n_embd: "
       "32, max_seq_len: 16}\n"
    << "data: {train: " << dir << "/data/train_*.bin, batch_size: " << l.batch
    << ", seq_len: 16, global_batch: " << l.global << "}\n"
    << "optim: {lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 2, eps: 1.0e-6, grad_clip: 0.5, "
       "grad_accum: "
    << (l.global > 0 ? 1 : l.accum) << "}\n"
    << "train: {steps: 6, peak_flops: 1.0e10, log_every: 100, val_every: 0, sample_every: 0, "
       "out_dir: "
    << out << "}\n"
    << "checkpoint: {every: 0, keep: 0}\n"
    << "logging: {jsonl: false, tensorboard: false}\n";
  if (l.dp * l.pp * l.cp * l.tp > 1) {
    y << "parallel: {dp: " << l.dp << ", pp: " << l.pp << ", cp: " << l.cp << ", tp: " << l.tp
      << ", vpp: " << l.vpp << ", schedule: " << l.schedule << ", zero_stage: " << l.zero_stage
      << ", mics_partition_size: " << l.mics << ", bucket_mb: 0.01}\n";
  }
  return parse_config_text(y.str());
}

std::unique_ptr<ParallelContext> context_for(const Layout& l) {
  if (l.dp * l.pp * l.cp * l.tp == 1) return nullptr;
  ParallelOptions po;
  po.shape = {.dp = l.dp, .pp = l.pp, .cp = l.cp, .tp = l.tp};
  po.mics_partition_size = l.mics;
  po.comm_timeout_s = testing::kTestCommTimeoutS;
  return std::make_unique<ParallelContext>(ParallelContext::create(po));
}

const Layout kSaver{.name = "tp2pp2", .pp = 2, .tp = 2, .batch = 2, .accum = 4};

// Shared by the cases: the data, the uninterrupted single-process run (its records and final
// checkpoint) and the tp2·pp2 run stopped at step 3. Built once, by every rank.
struct Fixture {
  std::string dir, saved, single_final;
  std::vector<StepRecord> single;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture x;
    std::unique_ptr<ParallelContext> ctx = context_for(kSaver);
    x.dir = testing::shared_train_data(*ctx, "loom_train_reshard");
    std::ostringstream log;
    {  // every rank runs the single process for itself
      const std::string out = x.dir + "/single_" + std::to_string(ctx->rank());
      Trainer single(config_for(Layout{}, x.dir, out), testing::trainer_options(log, nullptr));
      x.single = single.run();
      x.single_final = latest_checkpoint(out + "/checkpoints");
    }
    Trainer first(config_for(kSaver, x.dir, x.dir + "/saver"),
                  testing::trainer_options(log, ctx.get(), "", 3));
    first.run();
    x.saved = x.dir + "/saver/checkpoints/" + checkpoint_dir_name(3);
    ctx->world().barrier();
    return x;
  }();
  return f;
}

void expect_resumes_like_single(const Layout& l) {
  const Fixture& f = fixture();
  std::unique_ptr<ParallelContext> ctx = context_for(l);
  const int rank = testing::world_rank();
  // One process: every rank resumes for itself (into its own directory).
  const std::string out = f.dir + "/resumed_" + l.name + (ctx ? "" : "_" + std::to_string(rank));
  std::ostringstream log;
  std::vector<StepRecord> rest;
  std::string final_dir;
  {
    Config c = config_for(l, f.dir, out);
    c.checkpoint.async = true;  // the final checkpoint written in the background, then compared
    Trainer resumed(c, testing::trainer_options(log, ctx.get(), f.saved));
    EXPECT_EQ(resumed.step(), 3);
    rest = resumed.run();
    final_dir = latest_checkpoint(out + "/checkpoints");
  }
  ASSERT_EQ(rest.size(), 3u) << log.str();
  for (size_t i = 0; i < rest.size(); ++i) {
    const StepRecord& want = f.single[i + 3];
    EXPECT_NEAR(rest[i].loss, want.loss, kRelTol * std::abs(want.loss)) << "step " << i + 4;
    EXPECT_NEAR(rest[i].grad_norm, want.grad_norm, kRelTol * want.grad_norm) << "step " << i + 4;
  }
  if (rank == 0) {
    EXPECT_NE(log.str().find("resume: changed parallel."), std::string::npos) << log.str();
    testing::expect_close_checkpoints(final_dir, f.single_final, kParamAbsTol);
  }
  if (ctx) ctx->world().barrier();
}

TEST(TrainReshard, Tp2Pp2ToDp4Zero2) {
  expect_resumes_like_single({.name = "dp4z2", .dp = 4, .zero_stage = 2, .batch = 2});
}
TEST(TrainReshard, Tp2Pp2ToDp2Pp2InterleavedZero1) {
  expect_resumes_like_single({.name = "dp2pp2v2z1",
                              .dp = 2,
                              .pp = 2,
                              .vpp = 2,
                              .zero_stage = 1,
                              .batch = 2,
                              .accum = 2,
                              .schedule = "interleaved"});
}
TEST(TrainReshard, Tp2Pp2ToPp4Interleaved) {
  expect_resumes_like_single(
      {.name = "pp4v2", .pp = 4, .vpp = 2, .batch = 2, .accum = 4, .schedule = "interleaved"});
}
TEST(TrainReshard, Tp2Pp2ToDp2Cp2Zero3Mics) {
  expect_resumes_like_single(
      {.name = "dp2cp2z3mics", .dp = 2, .cp = 2, .zero_stage = 3, .mics = 2, .batch = 4});
}
TEST(TrainReshard, Tp2Pp2ToOneProcess) { expect_resumes_like_single({.name = "single"}); }
// data.global_batch keeps the 8 sequences per step at another size: grad_accum derived (Note
// [Global batch]) — 4 at one process of batch 2, 2 at dp2·tp2 of batch 2.
TEST(TrainReshard, Tp2Pp2ToOneProcessKeepingTheGlobalBatch) {
  expect_resumes_like_single({.name = "single_global", .batch = 2, .global = 8});
}
TEST(TrainReshard, Tp2Pp2ToDp2Tp2KeepingTheGlobalBatch) {
  expect_resumes_like_single({.name = "dp2tp2_global", .dp = 2, .tp = 2, .batch = 2, .global = 8});
}

// train.init_from of a checkpoint written at another layout: a tp2·dp2 run's first step (fresh
// optimizer state, the checkpoint's weights, step 1's batch) equals one process's from the same
// checkpoint.
TEST(TrainReshard, InitFromAnotherLayout) {
  const Fixture& f = fixture();
  const Layout l{.name = "init_tp2", .dp = 2, .tp = 2, .batch = 4};
  std::unique_ptr<ParallelContext> ctx = context_for(l);
  std::ostringstream log;
  Config c = config_for(l, f.dir, f.dir + "/init_tp2");
  c.train.init_from = f.saved;
  c.train.steps = 1;
  c.optim.warmup_steps = 0;
  Trainer from(c, testing::trainer_options(log, ctx.get()));
  const auto got = from.run();
  // The same weights and step 1's batch in one process.
  Config s = config_for(Layout{}, f.dir, f.dir + "/init_single_" + std::to_string(ctx->rank()));
  s.train.init_from = f.saved;
  s.train.steps = 1;
  s.optim.warmup_steps = 0;
  std::ostringstream slog;
  Trainer single(s, testing::trainer_options(slog, nullptr));
  const auto want = single.run();
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(want.size(), 1u);
  EXPECT_NEAR(got[0].loss, want[0].loss, kRelTol * std::abs(want[0].loss));
  EXPECT_NEAR(got[0].grad_norm, want[0].grad_norm, kRelTol * want[0].grad_norm);
  EXPECT_NE(got[0].loss, f.single[0].loss);  // not the random initial weights
  // The same weights exported to a Hugging Face directory (rank 0), then read by the tp2 run.
  const std::string hf = f.dir + "/init_hf";
  if (ctx->rank() == 0) {
    ConvertOptions o;
    o.vocab_multiple = 32;
    convert_model("loom:" + f.saved, "hf:" + hf, o);
  }
  ctx->world().barrier();
  Config h = c;
  h.train.init_from = hf;
  h.train.out_dir = f.dir + "/init_tp2_hf";
  Trainer from_hf(h, testing::trainer_options(log, ctx.get()));
  const auto got_hf = from_hf.run();
  ASSERT_EQ(got_hf.size(), 1u);
  EXPECT_EQ(got_hf[0].loss, got[0].loss);  // the same values through another file
  EXPECT_EQ(got_hf[0].grad_norm, got[0].grad_norm);
  ctx->world().barrier();
}

// A resume whose model differs is refused, naming the key, before anything is read.
TEST(TrainReshard, ChangedModelIsRefusedNamingTheKey) {
  const Fixture& f = fixture();
  std::ostringstream log;
  Config c =
      config_for(Layout{}, f.dir, f.dir + "/refused_" + std::to_string(testing::world_rank()));
  c.model.n_layer = 2;
  try {
    Trainer t(c, testing::trainer_options(log, nullptr, f.saved));
    FAIL() << "a resume with another model.n_layer must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_layer 8 → 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::parallel
