// tests/train/plan_packed_test.cpp — the step-time model of packed documents (Note [Packed step
// time] in train/planner/packed_steps.h): the planned steps are the trainer's own (the loader's
// micro-batches, documents and loss tokens, ZeRO-3's padding), each micro-batch is priced part
// by part from the calibration, and the ranks meet at the end of the step (DDP, ODC) or at every
// micro-batch (ZeRO-3 with collectives). No time is asserted: every expectation is computed from
// the calibration's own numbers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "data/documents.h"
#include "data/packed_loader.h"
#include "train/config.h"
#include "train/planner/calibrate.h"
#include "train/planner/packed_steps.h"
#include "train/planner/step_time.h"
#include "train/trainer.h"

namespace loom::planner {
namespace {

// Document shards of `lengths` tokens each (the first half of each document prompt, the rest
// the reply: loss-mask 1), under a fresh temporary directory; returns its train glob.
std::string documents(const std::string& name, const std::vector<int64_t>& lengths) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("loom_plan_packed_" + std::to_string(::getpid()) + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets = {0};
  for (int64_t n : lengths) {
    for (int64_t i = 0; i < n; ++i) {
      tokens.push_back(static_cast<int32_t>((i * 7 + n) % 60));
      mask.push_back(i >= n / 2 ? 1 : 0);
    }
    offsets.push_back(static_cast<int64_t>(tokens.size()));
  }
  write_document_shard((dir / "train_000000.bin").string(), tokens, mask, offsets);
  return (dir / "train_*.bin").string();
}

Config packed(const std::string& train, const std::string& parallel) {
  return parse_config_text(
      "model: {arch: gpt2, vocab_size: 64, vocab_multiple: 64, n_layer: 2, n_head: 2, n_embd: 16,"
      " max_seq_len: 32}\n"
      "data: {train: " +
      train +
      ", batch_size: 4, seq_len: 32, packing: true, max_tokens_per_microbatch: 48, "
      "balance: none}\n"
      "train: {steps: 3}\n"
      "parallel: " +
      parallel + "\n");
}

// Long-tailed lengths: the ranks' shares differ.
std::vector<int64_t> skewed() {
  std::vector<int64_t> l;
  for (int i = 0; i < 40; ++i) l.push_back(i % 5 == 0 ? 33 : 3 + (i * 5) % 11);
  return l;
}

TEST(PlanPacked, StepsAreTheLoadersOwn) {
  const Config cfg = packed(documents("own", skewed()), "{dp: 2}");
  const PackedSteps plan = plan_packed_steps(cfg, 3);
  ASSERT_EQ(plan.steps.size(), 3U);
  EXPECT_EQ(plan.budget, 48);
  double tokens = 0;
  for (int64_t r = 0; r < 2; ++r) {
    PackedLoader loader(expand_shards(cfg.data.train, "data.train"),
                        packing_options(cfg, r, 2, false));
    for (size_t s = 0; s < 3; ++s) {
      const PackedStep step = loader.next();
      const RankMicroBatches& mine = plan.steps[s][static_cast<size_t>(r)];
      ASSERT_EQ(mine.size(), step.micro.size());
      for (size_t m = 0; m < mine.size(); ++m) {
        int64_t sum = 0;
        for (int64_t n : mine[m].documents) sum += n;
        EXPECT_EQ(sum, step.micro[m].tokens());
        EXPECT_EQ(static_cast<int64_t>(mine[m].documents.size()), step.micro[m].documents);
        EXPECT_EQ(mine[m].loss_tokens, step.micro[m].loss_tokens);
      }
      if (r == 0) tokens += static_cast<double>(step.global_tokens);
    }
  }
  EXPECT_DOUBLE_EQ(plan.tokens_per_step, tokens / 3);
  EXPECT_EQ(plan.reference % 64, 0);
}

TEST(PlanPacked, Zero3WithCollectivesPadsTheRanks) {
  const std::string train = documents("pad", skewed());
  const PackedSteps zero3 = plan_packed_steps(packed(train, "{dp: 2, zero_stage: 3}"), 3);
  const PackedSteps odc = plan_packed_steps(packed(train, "{dp: 2, zero_stage: 3, odc: true}"), 3);
  bool padded = false;
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(zero3.steps[s][0].size(), zero3.steps[s][1].size());
    padded = padded || odc.steps[s][0].size() != odc.steps[s][1].size();
  }
  EXPECT_TRUE(padded) << "the data should give the ranks different micro-batch counts";
}

TEST(PlanPacked, MicroBatchesArePricedPartByPart) {
  PackedSteps plan;
  plan.reference = 64;
  // One step: rank 0 two micro-batches, rank 1 one.
  plan.steps = {{{{{10, 20}, 5}, {{40}, 30}}, {{{8, 8, 8}, 12}}}};
  const PassTimes block{3.0, 5.0}, rest{2.0, 4.0}, attn{1.0, 2.0}, loss{0.5, 1.0};
  auto time = [&](const PackedMicroBatch& mb) {
    double L = 0, sq = 0;
    for (int64_t s : mb.documents) {
      L += s;
      sq += static_cast<double>(s * s);
    }
    const double f = L / 64, a = sq / (64.0 * 64), l = mb.loss_tokens / 64.0;
    const double b = (3.0 - 1.0) * f + 1.0 * a + (5.0 - 2.0) * f + 2.0 * a;
    const double r = (2.0 - 0.5) * f + 0.5 * l + (4.0 - 1.0) * f + 1.0 * l;
    return 2 * b + r;  // n_layer 2
  };
  const RankMicroBatches& r0 = plan.steps[0][0];
  const RankMicroBatches& r1 = plan.steps[0][1];
  const double end = std::max(time(r0[0]) + time(r0[1]), time(r1[0]));
  const double unit = std::max(time(r0[0]), time(r1[0])) + time(r0[1]);
  EXPECT_NEAR(price_packed_steps(plan, 2, block, rest, attn, loss, false).compute_s, end, 1e-12);
  EXPECT_NEAR(price_packed_steps(plan, 2, block, rest, attn, loss, true).compute_s, unit, 1e-12);
  EXPECT_EQ(price_packed_steps(plan, 2, block, rest, attn, loss, true).micro_batches, 2);
}

TEST(PlanPacked, StepTimeComputeIsThePricedSteps) {
  const std::string train = documents("time", skewed());
  Calibration cal;
  ClusterLinks links;
  links.intra.fit(Collective::kAllReduce) = {1e-5, 1e9};
  for (Collective c : kCollectives) links.intra.fit(c) = {1e-5, 1e9};
  for (const auto& [parallel, per_unit] :
       std::vector<std::pair<std::string, bool>>{{"{dp: 1}", false},
                                                 {"{dp: 2}", false},
                                                 {"{dp: 2, zero_stage: 3}", true},
                                                 {"{dp: 2, zero_stage: 3, odc: true}", false}}) {
    const Config cfg = packed(train, parallel);
    const PackedSteps steps = plan_packed_steps(cfg, cfg.train.steps);
    const StepTimePlan p = plan_step_time(cfg, cal, links);
    const ModelConfig& m = cfg.model;
    ModelConfig measured = m;
    measured.max_seq_len = std::max<int64_t>(m.max_seq_len, steps.reference);
    const int64_t T = steps.reference;
    const PackedCompute want = price_packed_steps(
        steps, m.n_layer, cal.block(measured, cfg.train, 1, T), cal.rest(measured, cfg.train, 1, T),
        cal.attention(1, m.n_head, m.kv_heads(), T, m.n_embd / m.n_head, "f32"),
        cal.cross_entropy(T, m.padded_vocab(), "f32"), per_unit);
    ASSERT_EQ(p.lines.front().what, "compute") << parallel;
    EXPECT_NEAR(p.lines.front().seconds, want.compute_s, 1e-12) << parallel;
    EXPECT_NEAR(p.tokens_per_s * p.step_s, steps.tokens_per_step, 1e-6) << parallel;
  }
}

}  // namespace
}  // namespace loom::planner
