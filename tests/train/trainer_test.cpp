// tests/train/trainer_test.cpp — end to end on synthetic shards: the loss falls well below
// ln(vocab); 2N steps equal N steps + resume + N steps bit for bit; metrics are written; the
// train tool exits 2 with a one-line error on bad config and checkpoints on SIGINT.
#include "train/trainer.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/ops/view.h"
#include "data/shard.h"
#include "layers/transformer.h"
#include "train/checkpoint.h"
#include "train/llmc_format.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

// A fresh directory with train/val shards of a learnable stream over a 64-token vocabulary:
// short repeating phrases with a little noise.
std::string make_data(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/loom_trainer_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir + "/data");
  std::vector<int32_t> tokens;
  uint32_t x = 12345;
  for (int i = 0; i < 20000; ++i) {
    x = x * 1103515245u + 12345u;
    const int32_t phrase = static_cast<int32_t>((x >> 16) % 4);
    for (int32_t k = 0; k < 6; ++k) tokens.push_back(phrase * 10 + k);
  }
  write_shard(dir + "/data/train_000000.bin",
              std::span<const int32_t>(tokens.data(), tokens.size() - 2000));
  write_shard(dir + "/data/val_000000.bin",
              std::span<const int32_t>(tokens.data() + tokens.size() - 2000, 2000));
  return dir;
}

TrainerOptions quiet(std::ostream& log, const std::string& resume = "", int64_t stop_at = 0) {
  TrainerOptions o;
  o.log = &log;
  o.resume = resume;
  o.stop_at_step = stop_at;
  return o;
}

Config tiny_config(const std::string& dir, int64_t steps) {
  std::ostringstream y;
  y << "model: {arch: gpt2, vocab_size: 64, vocab_multiple: 32, n_layer: 2, n_head: 2, n_embd: 32, "
       "max_seq_len: 16}\n"
    << "data: {train: " << dir << "/data/train_*.bin, val: " << dir
    << "/data/val_*.bin, batch_size: 4, seq_len: 16}\n"
    << "optim: {lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 5, grad_accum: 2}\n"
    << "train: {steps: " << steps
    << ", peak_flops: 1.0e10, log_every: 100, val_every: 0, sample_every: 0, out_dir: " << dir
    << "/run}\n"
    << "checkpoint: {every: 0, keep: 0}\n";
  return parse_config_text(y.str());
}

TEST(Trainer, LossFallsWellBelowLogVocab) {
  const std::string dir = make_data("falls");
  std::ostringstream log;
  Config cfg = tiny_config(dir, 40);
  cfg.data.val = dir + "/data/val_*.bin";
  Trainer t(cfg, quiet(log));
  const auto records = t.run();
  ASSERT_EQ(records.size(), 40u);
  EXPECT_NEAR(records.front().loss, std::log(64.0), 0.5);
  EXPECT_LT(records.back().loss, 0.5 * std::log(64.0)) << log.str();
  EXPECT_LT(t.evaluate(), 0.5 * std::log(64.0));
  // Metrics: one JSON line per step with the logged keys.
  std::ifstream jsonl(dir + "/run/metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(jsonl, line)) {
    if (line.find("\"train/loss\"") != std::string::npos) ++lines;
  }
  EXPECT_EQ(lines, 40);
}

// train.noise_scale (train/noise_scale.h): one process with accumulation reports it every step,
// in the log line and the metrics; layouts that cannot serve it are refused naming the key.
TEST(Trainer, ReportsTheGradientNoiseScale) {
  const std::string dir = make_data("noise");
  std::ostringstream log;
  Config cfg = tiny_config(dir, 6);
  cfg.train.noise_scale = true;
  cfg.train.log_every = 1;
  Trainer t(cfg, quiet(log));
  const auto records = t.run();
  ASSERT_EQ(records.size(), 6u);
  for (const StepRecord& r : records) {
    ASSERT_TRUE(r.noise_scale.has_value()) << "step " << r.step;
    EXPECT_TRUE(std::isfinite(*r.noise_scale)) << "step " << r.step;
  }
  EXPECT_NE(log.str().find("noise scale"), std::string::npos) << log.str();
  std::ifstream jsonl(dir + "/run/metrics.jsonl");
  std::stringstream all;
  all << jsonl.rdbuf();
  EXPECT_NE(all.str().find("train/noise_scale_tokens"), std::string::npos);

  Config one = tiny_config(dir, 10);
  one.train.noise_scale = true;
  one.optim.grad_accum = 1;
  try {
    validate_config(one);
    FAIL() << "noise_scale without accumulation must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.noise_scale"), std::string::npos) << e.what();
  }
  Config tp = tiny_config(dir, 10);
  tp.train.noise_scale = true;
  tp.parallel.tp = 2;
  EXPECT_THROW(validate_config(tp), ConfigError);
}

// Note [Batch ramp] in train/config.h: a ramped run (accumulation 1, 1, 2, 2, 3, 3 over six
// steps) is bit for bit the chain of plain runs with those accumulations, each resuming the
// last's checkpoint: the same data positions, schedule and optimizer state.
TEST(Trainer, BatchRampIsTheChainOfPlainRuns) {
  const std::string dir_a = make_data("ramp_a"), dir_b = make_data("ramp_b");
  std::ostringstream log;
  Config ramped = tiny_config(dir_a, 6);
  ramped.optim.grad_accum = 3;
  ramped.train.batch_ramp_steps = 4;
  ramped.train.batch_ramp_start = 1;
  for (int64_t t = 1; t <= 6; ++t)
    EXPECT_EQ(ramp_micro_batches(ramped, t), t <= 2 ? 1 : t <= 4 ? 2 : 3) << "step " << t;
  Trainer a(ramped, quiet(log));
  const auto full = a.run();
  ASSERT_EQ(full.size(), 6u);

  std::vector<StepRecord> chain;
  Config plain = tiny_config(dir_b, 6);
  for (const auto& [accum, stop] : {std::pair<int64_t, int64_t>{1, 2}, {2, 4}, {3, 0}}) {
    plain.optim.grad_accum = accum;
    Trainer t(plain, quiet(log, chain.empty() ? "" : "latest", stop));
    const auto part = t.run();
    chain.insert(chain.end(), part.begin(), part.end());
    if (stop == 0) {
      const auto pa = a.parameters(), pb = t.parameters();
      ASSERT_EQ(pa.size(), pb.size());
      for (size_t i = 0; i < pa.size(); ++i)
        EXPECT_EQ(pa[i].second.to_vector(), pb[i].second.to_vector()) << pa[i].first;
    }
  }
  ASSERT_EQ(chain.size(), full.size()) << log.str();
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(chain[i].loss, full[i].loss) << "step " << i + 1;  // bit-identical
    EXPECT_EQ(chain[i].grad_norm, full[i].grad_norm) << "step " << i + 1;
  }
  Config bad = tiny_config(dir_a, 6);
  bad.train.batch_ramp_steps = 4;
  bad.train.batch_ramp_start = 2;  // not below grad_accum 2
  EXPECT_THROW(validate_config(bad), ConfigError);
}

TEST(Trainer, ResumeIsBitIdentical) {
  const std::string dir_a = make_data("resume_a"), dir_b = make_data("resume_b");
  std::ostringstream log;
  Config cfg_a = tiny_config(dir_a, 12);
  cfg_a.model.dropout = 0.1;  // exercises the dropout generator's saved state too
  Trainer a(cfg_a, quiet(log));
  const auto full = a.run();

  Config cfg_b = tiny_config(dir_b, 12);
  cfg_b.model.dropout = 0.1;
  std::vector<StepRecord> parts;
  {
    Trainer first(cfg_b, quiet(log, "", 6));
    parts = first.run();
  }
  ASSERT_EQ(parts.size(), 6u);
  // What recompute keeps may change on resume (Note [Resume compatibility]): the same numbers.
  Config cfg_c = cfg_b;
  cfg_c.model.recompute = "selective";
  std::ostringstream rlog;
  Trainer second(cfg_c, quiet(rlog, "latest"));
  EXPECT_NE(rlog.str().find("resume: changed model.recompute none → selective"), std::string::npos)
      << rlog.str();
  EXPECT_EQ(second.step(), 6);
  const auto rest = second.run();
  parts.insert(parts.end(), rest.begin(), rest.end());
  ASSERT_EQ(parts.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(parts[i].loss, full[i].loss) << "step " << i + 1;  // bit-identical
    EXPECT_EQ(parts[i].grad_norm, full[i].grad_norm) << "step " << i + 1;
  }
  const auto pa = a.parameters(), pb = second.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(pa[i].second.to_vector(), pb[i].second.to_vector()) << pa[i].first;
}

// Note [Resume fallback]: with the newest checkpoints damaged — a flipped byte (step 6), a
// truncated tensor file (step 5), an unknown format version (step 4), a folder without
// meta.yaml (step 9) — `--resume latest` says which it skipped and why and resumes from step 3,
// continuing exactly as the uninterrupted run; a changed model is refused instead, naming the
// key; later saves prune an older folder without meta.yaml (step 1's, damaged by hand).
TEST(Trainer, ResumeLatestSkipsDamagedCheckpoints) {
  const std::string dir = make_data("fallback");
  std::ostringstream log;
  Config cfg = tiny_config(dir, 8);
  cfg.checkpoint.every = 1;
  std::vector<StepRecord> full;
  {
    Trainer t(cfg, quiet(log));
    full = t.run();
  }
  const std::string root = dir + "/run/checkpoints/";
  auto file = [&](int step) {
    return root + checkpoint_dir_name(step) + "/tensors_00000.safetensors";
  };
  fs::remove_all(root + checkpoint_dir_name(8));
  fs::remove_all(root + checkpoint_dir_name(7));
  {
    std::fstream f(file(6), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x55');
  }
  fs::resize_file(file(5), fs::file_size(file(5)) - 100);
  {
    const std::string meta = root + checkpoint_dir_name(4) + "/meta.yaml";
    std::ifstream in(meta);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.replace(text.find("format_version: 2"), 17, "format_version: 99");
    std::ofstream(meta, std::ios::trunc) << text;
  }
  fs::create_directories(root + checkpoint_dir_name(9));
  fs::remove(root + checkpoint_dir_name(1) + "/meta.yaml");
  std::ostringstream rlog;
  Config longer = cfg;
  longer.checkpoint.keep = 20;
  Trainer resumed(longer, quiet(rlog, "latest"));
  EXPECT_EQ(resumed.step(), 3);
  const std::string text = rlog.str();
  EXPECT_NE(text.find("skipped " + root + checkpoint_dir_name(9) + ": no meta.yaml"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("skipped " + root + checkpoint_dir_name(6) + ": "), std::string::npos);
  EXPECT_NE(text.find("is corrupt (checksum mismatch"), std::string::npos) << text;
  EXPECT_NE(text.find("skipped " + root + checkpoint_dir_name(5) + ": "), std::string::npos);
  EXPECT_NE(text.find("truncated"), std::string::npos) << text;
  EXPECT_NE(text.find("format version 99 is not supported"), std::string::npos) << text;
  const auto rest = resumed.run();
  ASSERT_EQ(rest.size(), 5u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i].loss, full[i + 3].loss) << i + 4;
  // The later saves prune a folder without meta.yaml older than them, not a newer one.
  EXPECT_FALSE(fs::exists(root + checkpoint_dir_name(1)));
  EXPECT_TRUE(fs::exists(root + checkpoint_dir_name(9)));
  Config other = cfg;
  other.model.n_embd = 64;
  try {
    Trainer refused(other, quiet(rlog, "latest"));
    FAIL() << "a changed model must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_embd 32 → 64"), std::string::npos) << e.what();
  }
  // Another accumulation is allowed, logged, and its changed global batch said.
  Config fewer = cfg;
  fewer.optim.grad_accum = 1;
  std::ostringstream flog;
  Trainer allowed(fewer, quiet(flog, "latest"));
  EXPECT_NE(flog.str().find("resume: changed optim.grad_accum 2 → 1"), std::string::npos)
      << flog.str();
  EXPECT_NE(flog.str().find("the global batch changes from 8 to 4 sequences per step"),
            std::string::npos)
      << flog.str();
}

// Note [Asynchronous checkpoints]: with checkpoint.async the tensor files are the same bytes as
// a synchronous save's, each checkpoint is published by the next save (or the end of the run),
// and a save abandoned before it is published leaves `latest` on the previous checkpoint, its
// temporary folder pruned by the next save.
TEST(Trainer, AsyncCheckpointsAreTheSameFilesAndPublishLate) {
  const std::string sync_dir = make_data("ckpt_sync"), async_dir = make_data("ckpt_async");
  std::ostringstream log;
  for (const bool async : {false, true}) {
    Config cfg = tiny_config(async ? async_dir : sync_dir, 6);
    cfg.checkpoint.every = 2;
    cfg.checkpoint.async = async;
    Trainer t(cfg, quiet(log));
    t.run();
  }
  for (int step : {2, 4, 6}) {
    auto bytes = [&](const std::string& dir) {
      std::ifstream in(
          dir + "/run/checkpoints/" + checkpoint_dir_name(step) + "/tensors_00000.safetensors",
          std::ios::binary);
      return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    };
    const std::string a = bytes(sync_dir), b = bytes(async_dir);
    EXPECT_FALSE(a.empty()) << step;
    EXPECT_TRUE(a == b) << "step " << step << ": the async save wrote other bytes";
  }
  EXPECT_NE(log.str().find("writing in the background"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("written in the background"), std::string::npos) << log.str();

  const std::string root = async_dir + "/run/checkpoints";
  const std::string before = latest_checkpoint(root);
  {  // a save killed before it is published
    CheckpointContents c;
    c.step = 99;
    c.tensors.push_back(whole_tensor("model.x", Tensor::ones({4})));
    CheckpointWriter abandoned(root, c, 0, nullptr, true);
  }
  EXPECT_EQ(latest_checkpoint(root), before);
  EXPECT_TRUE(fs::exists(root + "/.step_00000099.tmp"));
  CheckpointContents next;
  next.step = 100;
  save_checkpoint(root, next, 10);
  EXPECT_FALSE(fs::exists(root + "/.step_00000099.tmp"));
}

// Note [Stopping inside long loops]: with a stop requested, validation ends after its current
// batch and sampling before its next token, instead of running to the end of a long loop.
TEST(Trainer, StopRequestEndsValidationAndSamplingEarly) {
  const std::string dir = make_data("stop_loops");
  std::ostringstream log;
  Config cfg = tiny_config(dir, 8);
  cfg.data.val = dir + "/data/val_*.bin";
  cfg.train.val_steps = 100000;
  std::atomic<bool> stop{false};
  TrainerOptions o = quiet(log);
  o.stop = &stop;
  Trainer t(cfg, o);
  stop = true;
  const double v = t.evaluate();
  EXPECT_TRUE(std::isfinite(v));
  EXPECT_NE(log.str().find("validation stopped after 1 of 100000 batches"), std::string::npos)
      << log.str();
  EXPECT_EQ(t.sample(100000), "");  // no token drawn
}

// The effective config goes to <out_dir>/config.yaml (named on the log, not printed in full
// unless asked), and reading that file back gives the same config: every key, overrides included.
// A second run on the same out_dir is refused while the first holds it (train/run_lock.h).
// Step callbacks (train/trainer.h) fire once per step in the loop's order, see the step count
// they are documented to see, and can change the parameters between steps as a fork's outer
// optimizer would: one that puts back the initial weights after every update leaves the model
// at its initial values, while the reports still come from real steps.
TEST(Trainer, StepCallbacksRunAroundEveryStepAndMayChangeTheParameters) {
  const std::string dir = make_data("callbacks");
  std::ostringstream log;
  TrainerOptions o = quiet(log);
  std::vector<std::string> events;
  std::vector<StepRecord> reported;
  std::vector<Tensor> initial;
  o.callbacks.before_step = [&](Trainer& t, int64_t step) {
    EXPECT_EQ(t.step(), step - 1);
    if (initial.empty()) {
      for (const auto& [name, p] : t.trained_parameters()) initial.push_back(p.clone());
    }
    events.push_back("b" + std::to_string(step));
  };
  o.callbacks.after_update = [&](Trainer& t, int64_t step) {
    EXPECT_EQ(t.step(), step);
    auto params = t.trained_parameters();
    EXPECT_NE(params[0].second.to_vector(), initial[0].to_vector()) << "the update ran";
    for (size_t i = 0; i < params.size(); ++i) ops::copy_(params[i].second, initial[i]);
    events.push_back("u" + std::to_string(step));
  };
  o.callbacks.after_report = [&](Trainer&, const StepRecord& r) {
    reported.push_back(r);
    events.push_back("r" + std::to_string(r.step));
  };
  Trainer t(tiny_config(dir, 5), o);
  const std::vector<StepRecord> records = t.run();
  // Step N is reported once step N + 1 is launched (Note [Device step]); the last at once.
  EXPECT_EQ(events, (std::vector<std::string>{"b1", "u1", "b2", "u2", "r1", "b3", "u3", "r2", "b4",
                                              "u4", "r3", "b5", "u5", "r4", "r5"}));
  ASSERT_EQ(reported.size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) EXPECT_EQ(reported[i].loss, records[i].loss);
  const auto params = t.trained_parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(params[i].second.to_vector(), initial[i].to_vector()) << params[i].first;
}

TEST(Trainer, WritesTheEffectiveConfigBesideTheRun) {
  const std::string dir = make_data("config_file");
  std::ostringstream log;
  Config cfg = tiny_config(dir, 10);
  cfg.optim.lr = 3.25e-3;  // not the default, not the file's: must survive the round trip
  const std::string path = dir + "/run/config.yaml";
  std::string text;
  {
    Trainer t(cfg, quiet(log));
    ASSERT_TRUE(fs::exists(path));
    EXPECT_NE(log.str().find("effective config: " + path), std::string::npos) << log.str();
    EXPECT_EQ(log.str().find("model:\n"), std::string::npos) << "printed without print_config";
    std::ifstream in(path);
    text.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, config_to_yaml(cfg));
    EXPECT_EQ(config_to_yaml(parse_config_text(text)), text);
    EXPECT_EQ(parse_config_text(text).optim.lr, 3.25e-3);
    // A second run on the same out_dir while this one holds it is refused, naming this process.
    try {
      Trainer clash(cfg, quiet(log));
      ADD_FAILURE() << "two runs on one out_dir";
    } catch (const ConfigError& e) {
      EXPECT_NE(
          std::string(e.what()).find("is in use by another run (pid " + std::to_string(::getpid())),
          std::string::npos)
          << e.what();
    }
  }

  std::ostringstream printed;
  TrainerOptions o = quiet(printed);
  o.print_config = true;
  Trainer u(cfg, o);
  EXPECT_NE(printed.str().find("effective config:\n" + text), std::string::npos) << printed.str();
}

// Note [Device step]: a step is reported once its successor is launched, unless something reads
// the model after it (here the checkpoints of steps 3 and 6, validation at 5, and the end).
// Validation lines follow their step's line. Every step is still
// logged once, in order, with its record's numbers, and a checkpoint taken after a step whose
// predecessor was reported late holds that step's state: resuming from step 3 gives steps 4–7
// bit for bit. grad_clip 0.05 keeps the clipping factor (computed where the gradients lie)
// below 1 at every step.
TEST(Trainer, LateReportsKeepOrderAndCheckpointsHoldTheirStep) {
  const std::string dir = make_data("late_reports");
  std::ostringstream log;
  Config cfg = tiny_config(dir, 7);
  cfg.train.log_every = 1;
  cfg.train.val_every = 5;  // step 5 reported at once, its validation right after its line
  cfg.train.val_steps = 2;
  cfg.checkpoint.every = 3;
  cfg.optim.grad_clip = 0.05;
  Trainer a(cfg, quiet(log));
  const auto full = a.run();
  ASSERT_EQ(full.size(), 7u);
  std::istringstream lines(log.str());
  std::string line;
  int64_t next = 1;
  std::string previous;
  int validations = 0;
  while (std::getline(lines, line)) {
    if (line.find("val loss") != std::string::npos) {  // steps 5 and 7 (the last)
      const std::string k = line.substr(5, line.find(' ', 5) - 5);
      EXPECT_TRUE(k == "5" || k == "7") << line;
      EXPECT_EQ(previous.rfind("step " + k + "/7 | loss", 0), 0u) << line << " after: " << previous;
      ++validations;
    }
    previous = line;
    if (line.rfind("step ", 0) != 0 || line.find("/7 | loss ") == std::string::npos) continue;
    ASSERT_EQ(std::stoll(line.substr(5)), next) << log.str();
    const double logged = std::stod(line.substr(line.find("| loss ") + 7));
    const double norm = std::stod(line.substr(line.find("| norm ") + 7));
    EXPECT_NEAR(logged, full[static_cast<size_t>(next - 1)].loss, 1e-4) << line;
    EXPECT_NEAR(norm, full[static_cast<size_t>(next - 1)].grad_norm, 1e-3) << line;
    EXPECT_GT(full[static_cast<size_t>(next - 1)].grad_norm, 0.05) << "clipping was not engaged";
    ++next;
  }
  EXPECT_EQ(next, 8) << log.str();
  EXPECT_EQ(validations, 2) << log.str();
  for (size_t i = 0; i < full.size(); ++i) EXPECT_EQ(full[i].step, static_cast<int64_t>(i) + 1);

  Trainer resumed(cfg, quiet(log, dir + "/run/checkpoints/step_00000003"));
  ASSERT_EQ(resumed.step(), 3);
  const auto rest = resumed.run();
  ASSERT_EQ(rest.size(), 4u);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].loss, full[i + 3].loss) << "step " << i + 4;
    EXPECT_EQ(rest[i].grad_norm, full[i + 3].grad_norm) << "step " << i + 4;
  }
}

// Dynamic loss scaling decided on the device (Note [Device step]), on the CPU with f32: an
// initial scale of 2^140 overflows f32 (the scaled loss itself is inf), so the first steps are
// skipped — no update, not counted, the scale halved each time — until the scaled backward
// fits; then training proceeds with the gradients unscaled exactly. Every checkpoint holds the
// device's outcome (optimizer step count = steps − skipped, the scale, the skip count: the host
// copy is current when a checkpoint is written), a skipped step leaves the parameters as they
// were, and resuming inside the skipped run or after it gives the rest bit for bit.
TEST(Trainer, DynamicLossScalingSkipsOverflowsOnTheDeviceAndResumesExactly) {
  const std::string dir = make_data("loss_scaling"), dir_init = make_data("loss_scaling_init");
  std::ostringstream log;
  Config cfg = tiny_config(dir, 24);
  cfg.train.loss_scaling = "dynamic";
  cfg.train.initial_loss_scale = 0x1p140;
  cfg.train.log_every = 1;
  cfg.optim.grad_clip = 1.0;
  cfg.checkpoint.every = 1;
  Trainer a(cfg, quiet(log));
  const auto full = a.run();
  ASSERT_EQ(full.size(), 24u);
  size_t skipped = 0;
  while (skipped < full.size() && full[skipped].skipped) ++skipped;
  ASSERT_GE(skipped, 13u) << "2^140 down to 2^128 overflows f32\n" << log.str();
  ASSERT_LE(skipped, 20u) << log.str();
  for (size_t i = skipped; i < full.size(); ++i) {
    EXPECT_FALSE(full[i].skipped) << "step " << i + 1;
    EXPECT_TRUE(std::isfinite(full[i].grad_norm) && std::isfinite(full[i].loss))
        << "step " << i + 1;
  }
  EXPECT_LT(full.back().loss, full[skipped].loss) << "training did not proceed after the overflows";
  size_t overflow_lines = 0;
  for (size_t at = 0; (at = log.str().find("(overflow: step skipped)", at)) != std::string::npos;
       ++at)
    ++overflow_lines;
  EXPECT_EQ(overflow_lines, skipped);

  auto ckpt = [&](size_t step) {
    return load_checkpoint(dir + "/run/checkpoints/" +
                           checkpoint_dir_name(static_cast<int64_t>(step)));
  };
  for (const size_t j : {size_t{1}, skipped - 1, skipped, skipped + 1, size_t{24}}) {
    const CheckpointContents c = ckpt(j);
    const size_t s = std::min(j, skipped);
    EXPECT_EQ(std::stoll(c.state.at("optim.step_count")), static_cast<long long>(j - s))
        << "step " << j;
    EXPECT_EQ(std::stoll(c.state.at("loss_scale.skipped_steps")), static_cast<long long>(s))
        << "step " << j;
    EXPECT_EQ(std::stod(c.state.at("loss_scale.scale")), std::ldexp(1.0, 140 - static_cast<int>(s)))
        << "step " << j;
  }
  const Trainer fresh(tiny_config(dir_init, 24), quiet(log));  // the same seed: the initial weights
  auto weights = [](const CheckpointContents& c) {
    for (const auto& [name, t, piece] : c.tensors) {
      if (name == "model.blocks.0.mlp.fc.weight") return t.to_vector();
    }
    return std::vector<double>{};
  };
  std::vector<double> init;
  for (const auto& [name, p] : fresh.parameters()) {
    if (name == "blocks.0.mlp.fc.weight") init = p.to_vector();
  }
  ASSERT_FALSE(init.empty());
  EXPECT_EQ(weights(ckpt(skipped)), init) << "a skipped step changed the parameters";
  EXPECT_NE(weights(ckpt(skipped + 1)), init);

  for (const size_t from : {skipped - 2, skipped + 2}) {
    Trainer resumed(cfg, quiet(log, dir + "/run/checkpoints/" +
                                        checkpoint_dir_name(static_cast<int64_t>(from))));
    const auto rest = resumed.run();
    ASSERT_EQ(rest.size(), full.size() - from);
    for (size_t i = 0; i < rest.size(); ++i) {
      EXPECT_EQ(rest[i].skipped, full[from + i].skipped)
          << "from " << from << ", step " << from + i + 1;
      // Bit for bit; an overflowed step's loss or norm may be NaN on both sides.
      EXPECT_EQ(std::bit_cast<uint64_t>(rest[i].loss), std::bit_cast<uint64_t>(full[from + i].loss))
          << "from " << from << ", step " << from + i + 1;
      EXPECT_EQ(std::bit_cast<uint64_t>(rest[i].grad_norm),
                std::bit_cast<uint64_t>(full[from + i].grad_norm))
          << "from " << from << ", step " << from + i + 1;
    }
  }
}

// train.precision f64 with train.dtype f32: the trainer's mixed-precision path (compute dtype
// set on the model, f32 masters, f32 optimizer state) on the CPU. f64 compute is more accurate
// than the plain f32 run, so the two agree to f32 rounding: the step losses within 1e-4
// relative over 8 steps (AdamW amplifies early differences a little), and both stay f32.
TEST(Trainer, MixedPrecisionPathTracksThePlainRun) {
  const std::string dir_a = make_data("mixed_a"), dir_b = make_data("mixed_b");
  std::ostringstream log;
  Trainer plain(tiny_config(dir_a, 8), quiet(log));
  const auto want = plain.run();
  Config cfg = tiny_config(dir_b, 8);
  cfg.train.precision = "f64";
  Trainer mixed(cfg, quiet(log));
  const auto got = mixed.run();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i].loss, want[i].loss, 1e-4 * want[i].loss) << "step " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-3 * want[i].grad_norm) << "step " << i + 1;
    EXPECT_NE(got[i].loss, want[i].loss)
        << "step " << i + 1 << ": the f64 compute path did not run";
  }
  for (const auto& [name, p] : mixed.parameters()) EXPECT_EQ(p.dtype(), DType::kF32) << name;
  // The checkpoint holds the f32 masters; it resumes into a mixed run.
  Trainer resumed(cfg, quiet(log, "latest"));
  EXPECT_EQ(resumed.step(), 8);
  const auto pa = mixed.parameters(), pb = resumed.parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(pa[i].second.to_vector(), pb[i].second.to_vector()) << pa[i].first;
}

// Without a usable GPU, train.device cuda is a config error naming the key.
TEST(Trainer, CudaDeviceWithoutGpuIsAConfigError) {
  if (device_count(DeviceType::kCuda) > 0)
    GTEST_SKIP() << "a CUDA device is visible (tests/cuda covers it)";
  const std::string dir = make_data("no_gpu");
  std::ostringstream log;
  Config cfg = tiny_config(dir, 5);
  cfg.train.device = "cuda";
  try {
    Trainer t(cfg, quiet(log));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("train.device: cuda, but ", 0), 0u) << e.what();
  }
}

TEST(Trainer, InitFromLlmcModelFileAndCheckpoint) {
  const std::string dir = make_data("init_from");
  std::ostringstream log;
  const Config cfg = tiny_config(dir, 5);
  Transformer source(cfg.model);
  Generator gen(77);
  source.init_weights(gen);
  const std::string bin = dir + "/model.bin";
  save_llmc_model(bin, source);
  Config from_bin = cfg;
  from_bin.train.init_from = bin;
  Trainer t(from_bin, quiet(log));
  const auto want = source.named_parameters(), got = t.parameters();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(got[i].second.to_vector(), want[i].second.to_vector()) << want[i].first;
  // A native checkpoint works the same way.
  t.run();
  Config from_ckpt = cfg;
  from_ckpt.train.out_dir = dir + "/run2";
  from_ckpt.train.init_from = latest_checkpoint(dir + "/run/checkpoints");
  Trainer t2(from_ckpt, quiet(log));
  const auto p1 = t.parameters(), p2 = t2.parameters();
  for (size_t i = 0; i < p1.size(); ++i)
    EXPECT_EQ(p1[i].second.to_vector(), p2[i].second.to_vector()) << p1[i].first;
}

// Runs the train tool; returns its exit code and stderr.
std::pair<int, std::string> run_train_tool(const std::string& args, int signal_after_ms = 0) {
  // Unique per test process: ctest runs tests in parallel.
  const std::string err =
      ::testing::TempDir() + "/loom_train_stderr_" + std::to_string(getpid()) + ".txt";
  const std::string cmd = std::string(LOOM_BINARY_DIR) + "/train " + args + " >/dev/null 2>" + err;
  int status = 0;
  if (signal_after_ms == 0) {
    status = std::system(cmd.c_str());
  } else {
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    usleep(static_cast<useconds_t>(signal_after_ms) * 1000);
    kill(pid, SIGINT);
    waitpid(pid, &status, 0);
  }
  std::ifstream f(err);
  std::stringstream ss;
  ss << f.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ss.str()};
}

TEST(TrainTool, ConfigErrorExitsTwoWithOneLine) {
  const std::string path = ::testing::TempDir() + "/loom_bad_" + std::to_string(getpid()) + ".yaml";
  std::ofstream(path) << "model:\n  n_embd: 100\n  n_head: 3\n";
  const auto [code, err] = run_train_tool("--config " + path);
  EXPECT_EQ(code, 2);
  EXPECT_EQ(err,
            "config error: " + path + ": model.n_embd: 100 is not divisible by model.n_head 3\n");
  const auto [code2, err2] =
      run_train_tool("--config " + path + " --set model.n_head=4 --set optim.lrr=1");
  EXPECT_EQ(code2, 2);
  EXPECT_NE(err2.find("optim.lrr: unknown key"), std::string::npos) << err2;
  // Command-line values are validated like keys: exit 2 and one line naming the flag.
  for (const char* bad : {"abc", "-3", "0", "7x"}) {
    const auto [c3, e3] = run_train_tool("--config " + path + " --stop-at " + bad);
    EXPECT_EQ(c3, 2) << bad;
    EXPECT_EQ(
        e3, std::string("config error: --stop-at: expected a positive step, got '") + bad + "'\n");
  }
  const auto [c4, e4] = run_train_tool("--config " + ::testing::TempDir());
  EXPECT_EQ(c4, 2);
  EXPECT_NE(e4.find("is a directory, not a config file"), std::string::npos) << e4;
}

TEST(TrainTool, SigintCheckpointsAndExitsCleanly) {
  const std::string dir = make_data("sigint");
  const std::string cfg = dir + "/cfg.yaml";
  std::ofstream(cfg)
      << "model: {arch: gpt2, vocab_size: 64, vocab_multiple: 32, n_layer: 2, n_head: 2, n_embd: "
         "32, max_seq_len: 16}\n"
      << "data: {train: " << dir << "/data/train_*.bin, batch_size: 4, seq_len: 16}\n"
      << "train: {steps: 1000000, peak_flops: 1.0e10, sample_every: 0, val_every: 0, out_dir: "
      << dir << "/run}\n";
  const auto [code, err] = run_train_tool("--config " + cfg, 1500);
  EXPECT_EQ(code, 0) << err;
  const std::string latest = latest_checkpoint(dir + "/run/checkpoints");
  ASSERT_FALSE(latest.empty()) << err;
  EXPECT_GT(load_checkpoint(latest).step, 0);
}

// `train --eval` trains nothing and prints the validation loss of the model as built: here a
// checkpoint given as model.init_from, which must equal Trainer::evaluate() of a trainer built
// from the same checkpoint (and differs from the untrained model's).
TEST(TrainTool, EvalPrintsTheValidationLossOfTheModelAsBuilt) {
  const std::string dir = make_data("eval");
  std::ostringstream log;
  Config cfg = tiny_config(dir, 6);
  cfg.train.val_steps = 3;
  cfg.checkpoint.at_end = true;
  Trainer(cfg, quiet(log)).run();
  const std::string ckpt = latest_checkpoint(dir + "/run/checkpoints");
  ASSERT_FALSE(ckpt.empty());
  const std::string path = dir + "/cfg.yaml";
  std::ofstream(path) << config_to_yaml(cfg);
  const std::string out = dir + "/eval_stdout.txt";
  auto eval = [&](const std::string& extra) {
    const std::string cmd = std::string(LOOM_BINARY_DIR) + "/train --config " + path +
                            " --eval --set train.out_dir=" + dir + "/eval" + extra + " >" + out +
                            " 2>/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream f(out);  // the trainer's log, then "val loss X" as the last line
    std::string line, last;
    while (std::getline(f, line)) last = line;
    EXPECT_EQ(last.rfind("val loss ", 0), 0u) << last;
    return last.size() > 9 ? std::stod(last.substr(9)) : 0.0;
  };
  const double trained = eval(" --set model.init_from=" + ckpt);
  Config from = cfg;
  from.train.init_from = ckpt;
  from.train.out_dir = dir + "/eval_ref";
  const double want = Trainer(from, quiet(log)).evaluate();
  EXPECT_NEAR(trained, want, 1e-6 * want);
  EXPECT_GT(eval(""), trained + 0.1) << "the untrained model should be worse";
  EXPECT_FALSE(fs::exists(dir + "/eval/checkpoints")) << "--eval trains and saves nothing";
}

// --resume with what is not a checkpoint: exit 1, one line naming the path in Loom's words (no
// source location); a run's checkpoints folder resumes from its newest checkpoint.
TEST(TrainTool, ResumeErrorsNameThePathAndAFolderOfCheckpointsResumesItsNewest) {
  const std::string dir = make_data("resume_errors");
  const std::string cfg = dir + "/cfg.yaml";
  std::ofstream(cfg)
      << "model: {arch: gpt2, vocab_size: 64, vocab_multiple: 32, n_layer: 1, n_head: 2, n_embd: "
         "16, max_seq_len: 16}\n"
      << "data: {train: " << dir << "/data/train_*.bin, batch_size: 2, seq_len: 16}\n"
      << "optim: {warmup_steps: 0}\n"
      << "train: {steps: 2, peak_flops: 1.0e10, sample_every: 0, val_every: 0, out_dir: " << dir
      << "/run}\n"
      << "checkpoint: {every: 1}\n";
  ASSERT_EQ(run_train_tool("--config " + cfg).first, 0);
  for (const std::string& bad : {dir + "/nonexistent", dir + "/cfg.yaml", dir + "/data"}) {
    const auto [code, err] =
        run_train_tool("--config " + cfg + " --set train.out_dir=" + dir + "/r2 --resume " + bad);
    EXPECT_EQ(code, 1) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_NE(err.find(bad), std::string::npos) << err;
    EXPECT_EQ(err.find(".cpp:"), std::string::npos) << err;
  }
  const auto [code, err] =
      run_train_tool("--config " + cfg + " --set train.steps=3 --set " + "train.out_dir=" + dir +
                     "/r3 --resume " + dir + "/run/checkpoints");
  EXPECT_EQ(code, 0) << err;
  EXPECT_EQ(load_checkpoint(latest_checkpoint(dir + "/r3/checkpoints")).step, 3);
}

}  // namespace
}  // namespace loom
