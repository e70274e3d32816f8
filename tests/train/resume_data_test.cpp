// tests/train/resume_data_test.cpp — resuming over data that changed since the checkpoint (Note
// [Data fingerprint] in data/loader.h): re-prepared shards under the same glob stop the run,
// naming the shard and what changed, instead of passing for damage of every checkpoint and
// falling back to an older one; data moved to another folder still resumes. Also
// data_change's wording.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/documents.h"
#include "data/loader.h"
#include "data/shard.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

TEST(DataFingerprint, ChangesAreNamedByShard) {
  const std::string a = "t_0.bin: 10 tokens; t_1.bin: 20 tokens";
  EXPECT_EQ(data_change(a, a), "");
  EXPECT_EQ(data_change(a, "t_0.bin: 10 tokens; t_1.bin: 21 tokens"),
            "t_1.bin now holds 21 tokens, then 20 tokens");
  EXPECT_EQ(data_change(a, a + "; t_2.bin: 5 tokens"), "t_2.bin is new (5 tokens)");
  EXPECT_EQ(data_change(a, "t_0.bin: 10 tokens"), "t_1.bin (20 tokens) is gone");
  EXPECT_EQ(data_change(a, "t_1.bin: 20 tokens; t_0.bin: 10 tokens"), "the shards' order changed");
}

std::string fresh_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/loom_resume_data_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir + "/data");
  return dir;
}

// `docs` documents of 6 tokens (prompt 3, answer 3 with loss), token values from `salt`.
void write_sft(const std::string& path, int docs, int salt) {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets = {0};
  for (int d = 0; d < docs; ++d) {
    for (int i = 0; i < 6; ++i) {
      tokens.push_back(1 + (d * 7 + i * 3 + salt) % 60);
      mask.push_back(i >= 3 ? 1 : 0);
    }
    offsets.push_back(static_cast<int64_t>(tokens.size()));
  }
  write_document_shard(path, tokens, mask, offsets);
}

void write_plain(const std::string& path, int tokens, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < tokens; ++i) t.push_back((i * 5 + salt) % 60);
  write_shard(path, t);
}

Config config_for(const std::string& data_dir, const std::string& out, bool packed) {
  std::ostringstream y;
  y << "model: {arch: gpt2, vocab_size: 64, vocab_multiple: 32, n_layer: 1, n_head: 2, n_embd: "
       "16, max_seq_len: 16}\n"
    << "data: {train: " << data_dir << "/train_*.bin, batch_size: 2, seq_len: 8"
    << (packed ? ", packing: true" : "") << "}\n"
    << "optim: {warmup_steps: 0}\n"
    << "train: {steps: 3, peak_flops: 1.0e10, sample_every: 0, val_every: 0, out_dir: " << out
    << "}\n"
    << "checkpoint: {every: 1, keep: 0}\n"
    << "logging: {jsonl: false, tensorboard: false}\n";
  return parse_config_text(y.str());
}

// Trains 2 of 3 steps (checkpoints at 1 and 2), lets `change` rewrite the data, then resumes
// latest: the error, and the log (which must not show a fallback).
std::pair<std::string, std::string> resume_after(const std::string& dir, bool packed,
                                                 const std::function<void()>& change) {
  std::ostringstream log;
  TrainerOptions opt;
  opt.log = &log;
  opt.stop_at_step = 2;
  Trainer(config_for(dir + "/data", dir + "/run", packed), opt).run();
  EXPECT_EQ(load_checkpoint(latest_checkpoint(dir + "/run/checkpoints")).step, 2);
  change();
  std::ostringstream log2;
  TrainerOptions again;
  again.log = &log2;
  again.resume = "latest";
  try {
    Trainer(config_for(dir + "/data", dir + "/run", packed), again);
  } catch (const ConfigError& e) {
    return {e.what(), log2.str()};
  }
  return {"", log2.str()};
}

TEST(ResumeData, RepreparedDocumentShardsStopTheRunNamingTheShard) {
  const std::string dir = fresh_dir("packed");
  const std::string shard = dir + "/data/train_000000.bin";
  write_sft(shard, 16, 0);
  const auto [error, log] = resume_after(dir, true, [&] { write_sft(shard, 16, 1); });
  // Same size, other tokens: only the checksum tells.
  EXPECT_EQ(error.rfind("data.train: the data changed since checkpoint " + dir +
                            "/run/checkpoints/step_00000002 was written: train_000000.bin now "
                            "holds 96 tokens, 16 documents, checksum ",
                        0),
            0u)
      << error;
  EXPECT_EQ(log.find("resume: skipped"), std::string::npos) << "no fallback: " << log;
}

TEST(ResumeData, MoreTokensInAPlainShardStopTheRun) {
  const std::string dir = fresh_dir("plain");
  const std::string shard = dir + "/data/train_000000.bin";
  write_plain(shard, 400, 0);
  const auto [error, log] = resume_after(dir, false, [&] { write_plain(shard, 800, 0); });
  EXPECT_NE(error.find("train_000000.bin now holds 800 tokens, then 400 tokens"), std::string::npos)
      << error;
  EXPECT_EQ(log.find("resume: skipped"), std::string::npos) << "no fallback: " << log;
}

TEST(ResumeData, DataMovedToAnotherFolderResumes) {
  const std::string dir = fresh_dir("moved");
  write_sft(dir + "/data/train_000000.bin", 16, 0);
  std::ostringstream log;
  TrainerOptions opt;
  opt.log = &log;
  opt.stop_at_step = 2;
  Trainer(config_for(dir + "/data", dir + "/run", true), opt).run();
  fs::rename(dir + "/data", dir + "/moved");
  TrainerOptions again;
  again.log = &log;
  again.resume = "latest";
  Trainer t(config_for(dir + "/moved", dir + "/run", true), again);
  EXPECT_EQ(t.step(), 2);
}

}  // namespace
}  // namespace loom
