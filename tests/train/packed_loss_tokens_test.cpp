// tests/train/packed_loss_tokens_test.cpp — packed (SFT) data whose cut at data.seq_len leaves
// no loss token (Note [Loss tokens and the cut] in data/packed_loader.h): a step without loss
// tokens is skipped with a warning, the weights and the optimizer untouched, never averaged over
// max(n, 1); the cut's losses are counted and logged when the data is opened; training or
// validation data with no loss token left is refused naming the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/documents.h"
#include "data/packed_loader.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kSeqLen = 8;

// One document: a prompt of `prompt` tokens (mask 0), then a 3-token answer (mask 1). With a
// prompt of 8 or more the answer lies past the cut (seq_len + 1 = 9 tokens kept).
void add_doc(int64_t prompt, int32_t seed, std::vector<int32_t>& tokens, std::vector<uint8_t>& mask,
             std::vector<int64_t>& offsets) {
  for (int64_t i = 0; i < prompt; ++i) {
    tokens.push_back(1 + (seed + static_cast<int32_t>(i)) % 20);
    mask.push_back(0);
  }
  for (int32_t k = 0; k < 3; ++k) {
    tokens.push_back(30 + (seed + k) % 20);
    mask.push_back(1);
  }
  offsets.push_back(static_cast<int64_t>(tokens.size()));
}

// dir/<name>_000000.bin (+ .docs): `short_docs` documents whose answers fit, `long_docs` whose
// answers are cut off.
std::string write_docs(const std::string& dir, const std::string& name, int short_docs,
                       int long_docs) {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets = {0};
  for (int d = 0; d < short_docs + long_docs; ++d) {
    const bool cut = d % 2 == 1 ? d / 2 < long_docs : d / 2 >= short_docs;
    add_doc(cut ? 12 : 3, d, tokens, mask, offsets);
  }
  const std::string path = dir + "/" + name + "_000000.bin";
  write_document_shard(path, tokens, mask, offsets);
  return path;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/loom_loss_tokens_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

Config config_for(const std::string& dir, bool val) {
  std::ostringstream y;
  y << "model: {arch: gpt2, vocab_size: 64, vocab_multiple: 32, n_layer: 1, n_head: 2, n_embd: "
       "16, max_seq_len: 16}\n"
    << "data: {train: " << dir << "/train_*.bin" << (val ? ", val: " + dir + "/val_*.bin" : "")
    << ", batch_size: 1, seq_len: " << kSeqLen << ", packing: true}\n"
    << "optim: {lr: 1.0e-2, weight_decay: 0.1, warmup_steps: 0}\n"
    << "train: {steps: 8, peak_flops: 1.0e10, log_every: 1, val_every: " << (val ? 8 : 0)
    << ", val_steps: 4, sample_every: 0, out_dir: " << dir << "/run}\n"
    << "checkpoint: {every: 0, at_end: false}\n"
    << "logging: {jsonl: false, tensorboard: false}\n";
  return parse_config_text(y.str());
}

std::vector<std::vector<double>> snapshot(Trainer& t) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, p] : t.trained_parameters()) out.push_back(p.to_vector());
  return out;
}

TEST(PackedLossTokens, TheCutIsCountedWhenTheDataIsOpened) {
  const std::string dir = fresh_dir("stats");
  const std::string path = write_docs(dir, "train", 5, 3);
  PackingOptions o;
  o.docs_per_rank = 1;
  o.max_len = kSeqLen;
  o.max_tokens = kSeqLen;
  const PackedLoader loader({path}, o);
  const PackedDataStats& st = loader.stats();
  EXPECT_EQ(st.documents, 8);
  EXPECT_EQ(st.cut_documents, 3);    // 15 tokens > 9
  EXPECT_EQ(st.loss_tokens, 5 * 3);  // the short documents' answers
  EXPECT_EQ(st.cut_loss_tokens, 3 * 3);
  EXPECT_EQ(st.no_loss_documents, 3);
}

TEST(PackedLossTokens, DataWithNoLossTokenLeftIsRefusedNamingTheKey) {
  const std::string dir = fresh_dir("none");
  write_docs(dir, "train", 0, 4);
  std::ostringstream log;
  TrainerOptions opt;
  opt.log = &log;
  try {
    Trainer t(config_for(dir, false), opt);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("data.train (" + dir +
                            "/train_000000.bin): none of the 4 documents keeps "
                            "a loss token within data.seq_len 8",
                        0),
              0u)
        << msg;
    EXPECT_NE(msg.find("12 loss tokens lie past the cut"), std::string::npos) << msg;
  }
  // Training data that fits, validation data that does not: refused the same way.
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_docs(dir, "train", 4, 0);
  write_docs(dir, "val", 0, 4);
  try {
    Trainer t(config_for(dir, true), opt);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("data.val (", 0), 0u) << e.what();
  }
}

// Steps of one document each; the cut-off documents' steps are skipped: no update (weights,
// moments and step count as they were), a warning, loss NaN; the others train. The validation
// mean leaves out the batches without loss tokens.
TEST(PackedLossTokens, AStepWithoutLossTokensIsSkippedWithAWarning) {
  const std::string dir = fresh_dir("skip");
  write_docs(dir, "train", 4, 4);
  write_docs(dir, "val", 2, 2);
  std::ostringstream log;
  TrainerOptions opt;
  opt.log = &log;
  std::vector<std::vector<double>> before;
  std::vector<bool> changed;
  opt.callbacks.before_step = [&](Trainer& t, int64_t) { before = snapshot(t); };
  opt.callbacks.after_update = [&](Trainer& t, int64_t) {
    changed.push_back(snapshot(t) != before);
  };
  Trainer t(config_for(dir, true), opt);
  const std::vector<StepRecord> records = t.run();
  ASSERT_EQ(records.size(), 8u);
  ASSERT_EQ(changed.size(), 8u);
  int skipped = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const StepRecord& r = records[i];
    SCOPED_TRACE(::testing::Message() << "step " << r.step);
    EXPECT_EQ(changed[i], !r.skipped);
    if (r.skipped) {
      ++skipped;
      EXPECT_TRUE(std::isnan(r.loss));
      EXPECT_NE(log.str().find("step " + std::to_string(r.step) +
                               "/8 | warning: no loss token in this step's documents within "
                               "data.seq_len 8 (cut or masked): step skipped"),
                std::string::npos)
          << log.str();
    } else {
      EXPECT_GT(r.loss, 0.5);  // a real loss, not an average over nothing
      EXPECT_GT(r.grad_norm, 0.0);
    }
  }
  EXPECT_EQ(skipped, 4);  // one epoch of 8 documents: the four cut ones
  EXPECT_NE(log.str().find("data.train: 8 documents, 12 loss tokens; 4 longer than data.seq_len 8 "
                           "are cut, losing 12 of 24 loss tokens (50.0 %); 4 documents keep no "
                           "loss token"),
            std::string::npos)
      << log.str();
  const double val = t.evaluate();
  EXPECT_TRUE(std::isfinite(val));
  EXPECT_GT(val, 0.5);  // the mean over the two batches with loss tokens, not diluted by zeros
}

}  // namespace
}  // namespace loom
