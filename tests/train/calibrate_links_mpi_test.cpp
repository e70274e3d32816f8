// tests/train/calibrate_links_mpi_test.cpp — `train --calibrate-links` (train/planner/links.h)
// under MPI, three times in a row in one job: every rank must issue the same collectives in the
// same order (a rank that issued one all-reduce more than its peers crashed or hung Open MPI's
// nonblocking collectives), and every rank must report the same figures (each is agreed over the
// ranks: the slowest rank's time, rank 0's ratios). The model is big enough that one pass takes
// well over the 20 ms floor of the overlap measurement, where each rank's own time would set a
// different number of background all-reduces.
// loom-mpi-test: ranks 2 3
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "parallel/parallel_context.h"
#include "tests/parallel/mpi_test_util.h"
#include "train/config.h"
#include "train/planner/calibrate.h"
#include "train/planner/links.h"

namespace loom::parallel {
namespace {

TEST(CalibrateLinks, RepeatedRunsAgreeOnEveryRank) {
  ParallelOptions po;
  po.shape.dp = testing::world_size();
  po.comm_timeout_s = testing::kTestCommTimeoutS;
  ParallelContext ctx = ParallelContext::create(po);
  const Config cfg = parse_config_text(
      "model: {arch: gpt2, n_layer: 2, n_head: 4, n_embd: 192, vocab_size: 512, max_seq_len: "
      "128}\n"
      "data: {train: unused/train_*.bin, batch_size: 8, seq_len: 128}\n"
      "parallel: {dp: " +
          std::to_string(testing::world_size()) + "}\n",
      {});
  for (int run = 0; run < 3; ++run) {
    planner::Calibration cal;  // no path: nothing read or written
    const std::string line = planner::calibrate_links(ctx, cfg, cal);
    for (const char* key :
         {"intra/all_reduce/bandwidth", "intra/odc_get/idle_bandwidth", "intra/send/latency"}) {
      const auto v = cal.link(key);
      ASSERT_TRUE(v.has_value()) << key << " missing after run " << run;
      EXPECT_GE(*v, 0) << key;
    }
    // Every rank printed the same line: its hash, gathered, is rank 0's everywhere.
    Tensor mine = Tensor::full(
        {1}, static_cast<double>(std::hash<std::string>{}(line) % (1LL << 52)), DType::kF64);
    Tensor all = Tensor::zeros({ctx.world_size()}, DType::kF64);
    ctx.world().all_gather_async(mine, all)->wait();
    for (int r = 0; r < ctx.world_size(); ++r)
      EXPECT_EQ(all.data<double>()[r], all.data<double>()[0])
          << "rank " << r << " reported other figures than rank 0; this rank's: " << line;
  }
}

}  // namespace
}  // namespace loom::parallel
