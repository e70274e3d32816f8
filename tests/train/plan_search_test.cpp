// tests/train/plan_search_test.cpp — the layout search (train/planner/search.h): every split of
// the GPUs is listed once with the config's global batch, a refused layout keeps its config
// error, a planned one fits exactly when its largest rank's plan fits the device, and the ones
// that fit come first.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "train/config.h"
#include "train/planner/memory.h"
#include "train/planner/search.h"

namespace loom::planner {
namespace {

Config small_model() {
  return parse_config_text(
      "model: {arch: gpt2, n_layer: 4, n_head: 4, n_embd: 64, vocab_size: 300, vocab_multiple: "
      "64, max_seq_len: 64}\n"
      "data: {train: unused_*.bin, batch_size: 2, seq_len: 64}\n"
      "optim: {lr: 1.0e-3, grad_accum: 4}\n"
      "train: {steps: 1, out_dir: unused}\n",
      {});
}

TEST(PlanSearch, EveryLayoutOnceWithTheGlobalBatchAndAReasonWhenRefused) {
  const Config base = small_model();
  DeviceSpec device = find_device("h100");
  const std::vector<LayoutCandidate> all = search_layouts(base, 8, device);
  std::set<std::string> seen;
  bool batch = false, heads = false, stages = false;
  for (const LayoutCandidate& c : all) {
    const ParallelConfig& p = c.config.parallel;
    EXPECT_EQ(p.dp * p.tp * p.pp * p.cp, 8) << c.layout;
    EXPECT_TRUE(seen.insert(c.layout).second) << "listed twice: " << c.layout;
    if (c.peak_bytes > 0) {  // planned: the global batch of 2·4 = 8 sequences is kept
      EXPECT_EQ(global_batch_sequences(c.config), 8) << c.layout;
      EXPECT_TRUE(c.fits) << c.layout << ": " << c.reason;  // a tiny model fits an H100
    } else {
      EXPECT_FALSE(c.fits);
      EXPECT_FALSE(c.reason.empty()) << c.layout;
      batch = batch || c.reason.find("does not split into micro-batches") != std::string::npos;
      heads = heads || c.reason.find("parallel.tp: 8 does not divide") != std::string::npos;
      stages = stages || c.reason.find("parallel.microbatches") != std::string::npos;
    }
  }
  // dp 8 cannot keep 8 sequences in micro-batches of 2; tp 8 does not divide 4 heads; pp 8 has
  // 4 micro-batches for 8 stages: each refused with its reason.
  EXPECT_TRUE(batch);
  EXPECT_TRUE(heads);
  EXPECT_TRUE(stages);
}

TEST(PlanSearch, FitsExactlyWhenTheLargestRankFitsAndThoseComeFirst) {
  const Config base = small_model();
  DeviceSpec device = find_device("h100");
  // A device between the smallest and the largest planned peak.
  std::vector<LayoutCandidate> all = search_layouts(base, 2, device);
  int64_t lo = 0, hi = 0;
  for (const LayoutCandidate& c : all) {
    if (c.peak_bytes == 0) continue;
    lo = lo == 0 ? c.peak_bytes : std::min(lo, c.peak_bytes);
    hi = std::max(hi, c.peak_bytes);
  }
  ASSERT_LT(lo, hi);
  device.memory_bytes = (lo + hi) / 2 + kCublasLtWorkspaceBytes;
  all = search_layouts(base, 2, device);
  bool seen_misfit = false;
  for (const LayoutCandidate& c : all) {
    if (c.peak_bytes > 0) {
      EXPECT_EQ(c.fits, c.peak_bytes + kCublasLtWorkspaceBytes <= device.memory_bytes) << c.layout;
      int64_t largest = 0;
      for (int64_t r = 0; r < c.config.parallel.pp; ++r)
        largest = std::max(largest, plan_memory(c.config, {0, r, 0, 0}).peak_bytes);
      EXPECT_EQ(c.peak_bytes, largest) << c.layout;
    }
    if (!c.fits) seen_misfit = true;
    if (c.fits && seen_misfit) ADD_FAILURE() << c.layout << " fits but is listed after a misfit";
  }
  EXPECT_TRUE(seen_misfit);
  const std::string table = format_search(all, 2, device);
  EXPECT_NE(table.find("not by predicted speed: add --time"), std::string::npos) << table;
}

}  // namespace
}  // namespace loom::planner
