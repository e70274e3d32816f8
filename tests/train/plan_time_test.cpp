// tests/train/plan_time_test.cpp — the step-time model (train/planner/step_time.h) and its
// calibration cache (train/planner/calibrate.h): measurements are kept in the cache file and
// read back instead of measured again; the model composes the measured parts exactly as Note
// [Step-time model] writes (one process, accumulation, the data-parallel buckets against the
// links, a pipeline's makespan from the simulator); what it does not cover is refused naming
// the key; the search ranks by it. No time is asserted: every expectation is computed from the
// calibration's own numbers. (Predicted against measured: tools/bench/step_time_bench.sh.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/error.h"
#include "layers/transformer.h"
#include "train/config.h"
#include "train/planner/calibrate.h"
#include "train/planner/devices.h"
#include "train/planner/dp_backward.h"
#include "train/planner/memory.h"
#include "train/planner/search.h"
#include "train/planner/step_time.h"

namespace loom::planner {
namespace {

Config tiny(const std::string& extra = "") {
  return parse_config_text(
      "model: {arch: gpt2, vocab_size: 64, vocab_multiple: 64, n_layer: 4, n_head: 2, n_embd: 16,"
      " max_seq_len: 16}\n"
      "data: {train: x.bin, batch_size: 2, seq_len: 16}\n" +
      extra);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("loom_plan_time_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

const StepTimePlan& check_line(const StepTimePlan& p, const std::string& what, double want) {
  for (const TimeLine& l : p.lines) {
    if (l.what == what) {
      EXPECT_NEAR(l.seconds, want, 1e-12 + 1e-9 * want) << what;
      return p;
    }
  }
  ADD_FAILURE() << "no line '" << what << "'";
  return p;
}

// A link whose every collective costs α + n/β (measured over 2 ranks).
LinkModel uniform(double alpha, double beta) {
  LinkModel l;
  for (Collective c : kCollectives) l.fit(c) = {alpha, beta};
  return l;
}

TEST(PlanTime, CalibrationIsCachedByDeviceAndShape) {
  const std::string path = temp_path("cache.json");
  const Config cfg = tiny();
  PassTimes block, lin;
  double opt = 0;
  {
    Calibration cal(path);
    block = cal.block(cfg.model, cfg.train, 2, 16);
    lin = cal.linear(32, 16, 48, true, "f32");
    opt = cal.optimizer("adamw", 1000, "f32");
    EXPECT_GT(block.total(), 0);
    EXPECT_GT(lin.total(), 0);
    EXPECT_GT(opt, 0);
    cal.set_link("intra/bandwidth", 1e9);
    cal.save();
  }
  ASSERT_TRUE(std::filesystem::exists(path));
  Calibration again(path);  // read back: the same numbers, not a new measurement
  EXPECT_EQ(again.block(cfg.model, cfg.train, 2, 16).fwd, block.fwd);
  EXPECT_EQ(again.block(cfg.model, cfg.train, 2, 16).bwd, block.bwd);
  EXPECT_EQ(again.linear(32, 16, 48, true, "f32").bwd, lin.bwd);
  EXPECT_EQ(again.optimizer("adamw", 1000, "f32"), opt);
  EXPECT_EQ(again.link("intra/bandwidth").value_or(0), 1e9);
  EXPECT_FALSE(again.link("inter/bandwidth").has_value());
  std::filesystem::remove(path);
}

TEST(PlanTime, ABadCacheFileIsNamed) {
  const std::string path = temp_path("bad.json");
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("[1, 2", f);
    std::fclose(f);
  }
  try {
    Calibration cal(path);
    FAIL() << "a file that is not a calibration must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": not a calibration file"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

TEST(PlanTime, OneProcessIsMicroBatchesOfBlocksAndRestPlusTheUpdate) {
  Calibration cal;
  for (int64_t accum : {1, 3}) {
    const Config cfg = tiny("optim: {grad_accum: " + std::to_string(accum) + "}\n");
    const PassTimes block = cal.block(cfg.model, cfg.train, 2, 16);
    const PassTimes rest = cal.rest(cfg.model, cfg.train, 2, 16);
    const StepTimePlan p = plan_step_time(cfg, cal, {});
    const double compute = accum * (4 * block.total() + rest.total());
    check_line(p, "compute", compute);
    ASSERT_EQ(p.lines.size(), 2U);  // compute and the optimizer: no communication, no bubble
    ASSERT_EQ(p.lines[1].what, "optimizer");
    EXPECT_NEAR(p.step_s, compute + p.lines[1].seconds, 1e-12);
    EXPECT_NEAR(p.tokens_per_s, 2.0 * 16 * accum / p.step_s, 1e-6);
  }
}

TEST(PlanTime, DataParallelExposesOnlyWhatRunsPastBackward) {
  Calibration cal;
  const Config base = tiny("parallel: {dp: 2}\n");
  const PassTimes block = cal.block(base.model, base.train, 2, 16);
  const PassTimes rest = cal.rest(base.model, base.train, 2, 16);
  const double bwd = 4 * block.bwd + rest.bwd;
  const double params = static_cast<double>(count_parameters(base.model));
  const double bytes = params * 4;
  // One bucket (the whole model is far below 25 MB): ready at the end of backward, so the
  // all-reduce is exposed whole, α + n/β over the 2 ranks it was measured on.
  ClusterLinks links;
  links.intra = uniform(1e-4, 1e8);
  const double all_reduce = 1e-4 + bytes / 1e8;
  StepTimePlan p = plan_step_time(base, cal, links);
  check_line(p, "dp gradients", all_reduce);
  // Buckets of a quarter of the gradients (Note [Buckets on the link]): the head's backward
  // runs first and fills none (its table is tied: complete only with the lookup's, at the
  // end); the blocks' 4 × 3280 parameters fill the first three at the ends of blocks 2, 3 and 4,
  // the last bucket is the rest's. A bucket's all-reduce is shorter than a block's backward
  // here, so the first is done before the next launches: the last two run past backward.
  std::ostringstream bucket;
  bucket << std::setprecision(17) << bytes / 4 / 1e6;
  Config small = tiny("parallel: {dp: 2, bucket_mb: " + bucket.str() + "}\n");
  const double quarter = 0.1 * bwd;  // each bucket's all-reduce (α = 0: n/β)
  ASSERT_LT(quarter, block.bwd);
  ASSERT_EQ(params, 4 * 3280 + 1312);  // the bucket boundaries above
  links.intra = uniform(0, (bytes / 4) / quarter);
  p = plan_step_time(small, cal, links);
  check_line(p, "dp gradients", 2 * quarter);
  // Without overlap every bucket waits for the end of backward.
  small.parallel.overlap = false;
  p = plan_step_time(small, cal, links);
  check_line(p, "dp gradients", 4 * quarter);
  // A link between hosts that was never measured is named.
  links.ranks_per_host = 1;
  try {
    plan_step_time(base, cal, links);
    FAIL() << "an unmeasured link must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no measured link between hosts"), std::string::npos)
        << e.what();
  }
}

TEST(PlanTime, APipelineIsTheSimulatorsMakespanWithEachStagesTimes) {
  Calibration cal;
  ClusterLinks links;
  links.intra = uniform(0, 1e30);  // transfers free: only the schedule
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    const Config cfg =
        tiny("parallel: {pp: 2, schedule: " + schedule + "}\noptim: {grad_accum: 4}\n");
    const PassTimes block = cal.block(cfg.model, cfg.train, 2, 16);
    const PassTimes rest = cal.rest(cfg.model, cfg.train, 2, 16);
    const double last = 2 * block.total() + rest.total();  // the slowest stage: 2 blocks + rest
    const StepTimePlan p = plan_step_time(cfg, cal, links);
    check_line(p, "compute", 4 * last);
    // Stage 0 (2 blocks) feeds stage 1 faster than it computes, so the last stage works without
    // a gap from stage 0's first forward to its last backward: the bubble is those two.
    double bubble = -1;
    for (const TimeLine& l : p.lines)
      if (l.what == "pipeline bubble") bubble = l.seconds;
    EXPECT_NEAR(bubble, 2 * block.fwd + 2 * block.bwd, 1e-5) << schedule;
  }
}

// `--search … --time`: every layout that fits gets a prediction, and they are listed fastest
// first, each with the options that make it; the ones that do not fit keep their reason.
TEST(PlanTime, TheSearchRanksTheLayoutsThatFitByPredictedTokensPerSecond) {
  Calibration cal;
  ClusterLinks links;
  links.intra = uniform(1e-5, 1e9);
  std::vector<LayoutCandidate> found =
      search_layouts(tiny("optim: {grad_accum: 2}\n"), 2, find_device("cpu"));
  rank_by_step_time(found, cal, links);
  ASSERT_FALSE(found.empty());
  bool seen_unranked = false;
  double previous = 1e300;
  int ranked = 0;
  for (const LayoutCandidate& c : found) {
    if (c.tokens_per_s > 0) {
      EXPECT_FALSE(seen_unranked) << c.layout << " is ranked after an unranked layout";
      EXPECT_LE(c.tokens_per_s, previous) << c.layout;
      previous = c.tokens_per_s;
      EXPECT_NEAR(c.tokens_per_s, 2.0 * 16 * 2 / c.step_s, 1e-6 * c.tokens_per_s) << c.layout;
      EXPECT_NE(c.overrides.find("--set parallel.dp="), std::string::npos) << c.layout;
      ++ranked;
    } else {
      seen_unranked = true;
      EXPECT_FALSE(c.reason.empty()) << c.layout;
    }
  }
  EXPECT_GE(ranked, 4);  // dp 2 with ZeRO 0..3 at least
  const std::string text = format_search(found, 2, find_device("cpu"));
  EXPECT_NE(text.find("ranked by predicted tokens/s"), std::string::npos) << text;
}

// Note [Data-sheet links]: a GPU's links before any cluster was measured are rings at the
// sheet's rates with NCCL's per-step latencies, within a host and (ranks_per_host apart) between
// hosts; the plan's MFU is the model's FLOPs at the predicted tokens/s over the sheet's rate.
TEST(PlanTime, ADataSheetLinkIsARingAtTheSheetsRates) {
  Calibration cal;
  const DeviceSpec& h100 = find_device("h100");
  const ClusterLinks links = links_from_sheet(h100, 0);
  EXPECT_EQ(links.ranks_per_host, 8);
  EXPECT_EQ(links.intra.source, "data sheet");
  for (const int64_t dp : {8, 16}) {
    const Config cfg = tiny("parallel: {dp: " + std::to_string(dp) + "}\n");
    const double bytes = static_cast<double>(count_parameters(cfg.model)) * 4;
    const double g = static_cast<double>(dp);
    // One bucket, ready at the end of backward: the whole all-reduce is exposed. 8 ranks share
    // a host (NVLink, 450 GB/s one way); 16 span two (the network, 50 GB/s per GPU).
    const double want = dp == 8 ? 2 * (g - 1) * 3.4e-6 + bytes * 2 * (g - 1) / g / 450e9
                                : 2 * (g - 1) * 14e-6 + bytes * 2 * (g - 1) / g / 50e9;
    const StepTimePlan p = plan_step_time(cfg, cal, links);
    check_line(p, "dp gradients", want);
    EXPECT_EQ(p.ranks, dp);
    EXPECT_EQ(p.flops_per_token, model_flops_per_token(cfg.model, 16));
    const double mfu = p.flops_per_token * p.tokens_per_s / (989e12 * g);
    std::ostringstream pct;
    pct << std::fixed << std::setprecision(1) << "MFU " << 100 * mfu << " %";
    EXPECT_NE(format_step_time(p, &h100).find(pct.str()), std::string::npos)
        << format_step_time(p, &h100) << " lacks " << pct.str();
  }
  try {
    links_from_sheet(find_device("cpu"), 0);
    FAIL() << "the CPU has no data-sheet links";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--device cpu:", 0), 0U) << e.what();
  }
}

// A plan for a GPU this machine does not have reads what was measured on one (the file's entries
// under that GPU's name) and measures nothing; a shape the file lacks is named.
TEST(PlanTime, APlanForAnAbsentGpuReplaysItsMeasurementsAndNamesAMissingOne) {
  const std::string path = temp_path("replay.json"), gpu = "NVIDIA H100 80GB HBM3";
  const Config cfg = tiny("optim: {grad_accum: 2}\n");
  double step = 0;
  {
    Calibration here(path);
    step = plan_step_time(cfg, here, {}).step_s;
    here.save();
    // What a run on that GPU would have written: the same entries under its name.
    std::ifstream in(path);
    nlohmann::json j = nlohmann::json::parse(in);
    j[gpu] = j[here.device()];
    j.erase(here.device());
    std::ofstream(path) << j.dump();
  }
  Calibration there(path, cfg.train, gpu);
  EXPECT_TRUE(there.replay_only());
  EXPECT_EQ(there.device(), gpu);  // f32 compute: no cuDNN attention, no TF32
  EXPECT_EQ(plan_step_time(cfg, there, {}).step_s, step);
  Config other = cfg;
  other.data.batch_size = 3;
  try {
    plan_step_time(other, there, {});
    FAIL() << "a shape measured nowhere must be named, not measured on this machine";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("has no measurement of 'block "), std::string::npos) << what;
    EXPECT_NE(what.find(" B3 T16' on " + gpu), std::string::npos) << what;
  }
  std::filesystem::remove(path);
}

// MiCS (parallel/dp/data_parallel.h): ZeRO within partitions of P consecutive dp ranks, the
// gradient shards all-reduced across the dp/P replicas after backward.
TEST(PlanTime, MicsShardsWithinPartitionsAndAllReducesTheShardsAcrossReplicas) {
  Calibration cal;
  ClusterLinks links;
  const double alpha = 1e-4, beta = 1e8;
  links.intra = uniform(alpha, beta);
  const Config base = tiny("parallel: {dp: 4, zero_stage: 2, mics_partition_size: 2}\n");
  const double params = static_cast<double>(count_parameters(base.model));
  const double bytes = params * 4;
  // One bucket, ready at the end of backward: its reduce-scatter over the partition (2 ranks),
  // the shard's all-reduce across the 2 replicas, the updated shard's all-gather over the
  // partition — each α + n/β at the 2 ranks the link was measured over.
  StepTimePlan p = plan_step_time(base, cal, links);
  check_line(p, "dp gradients",
             (alpha + bytes / beta) + (alpha + bytes / 2 / beta) + (alpha + bytes / beta));
  EXPECT_NE(
      p.lines[1].formula.find("update of " + std::to_string(count_parameters(base.model) / 2)),
      std::string::npos)
      << p.lines[1].formula;  // the optimizer updates the partition's shard
  // ZeRO-3: the same as ZeRO-3 over one partition, plus the replicas' all-reduce of the shard.
  Config mics3 = base, plain3 = base;
  mics3.parallel.zero_stage = plain3.parallel.zero_stage = 3;
  plain3.parallel.dp = 2;
  plain3.parallel.mics_partition_size = 0;
  auto line = [](const StepTimePlan& q, const std::string& what) {
    for (const TimeLine& l : q.lines)
      if (l.what == what) return l.seconds;
    ADD_FAILURE() << "no line " << what;
    return 0.0;
  };
  EXPECT_NEAR(line(plan_step_time(mics3, cal, links), "dp ZeRO-3") -
                  line(plan_step_time(plain3, cal, links), "dp ZeRO-3"),
              alpha + bytes / 2 / beta, 1e-12);
}

// ODC (Note [ODC] in parallel/odc/odc_gatherer.h): ZeRO-3's schedule with each unit pulled and
// pushed one-sidedly, priced at the one-sided rates, plus two barriers per step; a calibration
// without one-sided measurements is named.
TEST(PlanTime, OdcIsZero3AtTheOneSidedRatesPlusTwoBarriers) {
  Calibration cal;
  const Config zero3 = tiny("parallel: {dp: 2, zero_stage: 3}\n");
  Config odc = zero3;
  odc.parallel.odc = true;
  auto dp_line = [](const StepTimePlan& q) {
    for (const TimeLine& l : q.lines)
      if (l.what == "dp ZeRO-3") return l.seconds;
    ADD_FAILURE() << "no dp ZeRO-3 line";
    return 0.0;
  };
  ClusterLinks links;
  links.intra = uniform(1e-4, 1e8);
  // ODC's pulls on a CPU are copies by the calling thread (nothing hidden): against ZeRO-3 whose
  // hidden collectives cost all of their time (κ = 1, Note [Overlap cost]) and the same fits
  // for one-sided transfers as for the collectives, only the barriers differ.
  links.intra.overlap_cost = 1;
  EXPECT_NEAR(dp_line(plan_step_time(odc, cal, links)) - dp_line(plan_step_time(zero3, cal, links)),
              2 * 1e-4, 1e-12);
  // Pulls four times slower: ODC's line grows, ZeRO-3's does not.
  ClusterLinks slow_pulls = links;
  slow_pulls.intra.fit(Collective::kGet) = {1e-4, 0.25e8};
  EXPECT_GT(dp_line(plan_step_time(odc, cal, slow_pulls)),
            dp_line(plan_step_time(odc, cal, links)));
  EXPECT_EQ(dp_line(plan_step_time(zero3, cal, slow_pulls)),
            dp_line(plan_step_time(zero3, cal, links)));
  ClusterLinks none = links;
  none.intra.fit(Collective::kGet) = {};
  try {
    plan_step_time(odc, cal, none);
    FAIL() << "a calibration without one-sided transfers must be named";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("parallel.odc:", 0), 0U) << e.what();
  }
}

// Note [Idle and busy links] by hand: over a link slow enough that no block's gather hides,
// only the embeddings' and head's forward gathers run at the idle rate — a tied table twice,
// untied tables once (both in one), the backward gathers and reduce-scatters at the busy rate.
TEST(PlanTime, OnlyTheTablesForwardGathersRunOnAnIdleLink) {
  Calibration cal;
  const double beta = 1e3;  // bytes/s: a block's gather takes seconds, its compute microseconds
  auto zero3_line = [&](const Config& cfg, double idle) {
    ClusterLinks links;
    links.intra = uniform(0, beta);
    for (Collective c : kCollectives) links.intra.fit(c).idle_bytes_per_s = idle;
    for (const TimeLine& l : plan_step_time(cfg, cal, links).lines)
      if (l.what == "dp ZeRO-3") return l.seconds;
    ADD_FAILURE() << "no dp ZeRO-3 line";
    return 0.0;
  };
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    Config cfg = tiny("parallel: {dp: 2, zero_stage: 3}\n");
    cfg.model.tie_embeddings = tied;
    ModelConfig one = cfg.model, two = cfg.model;
    one.n_layer = 1;
    two.n_layer = 2;
    const double per_block =
        static_cast<double>(count_parameters(two)) - static_cast<double>(count_parameters(one));
    const double outside = static_cast<double>(count_parameters(one)) - per_block;
    const double x = outside * 4 / beta;  // the tables' gather at the busy rate (f32, 2 ranks)
    const double busy = zero3_line(cfg, 0);
    EXPECT_NEAR(busy - zero3_line(cfg, 2 * beta), (tied ? 2 : 1) * x / 2, 1e-9 * busy);
  }
}

// SDP under forward masking: the worker's packed MLP measured in place of the full one, its
// update and its sync — the held slices over their k holders as backward goes, then the
// replicated parameters over all N workers after backward.
TEST(PlanTime, SdpIsTheWorkersSubnetworkAndItsHolderSetsSync) {
  Calibration cal;
  ClusterLinks links;
  links.intra = uniform(1e-4, 1e8);
  const Config sdp = tiny("parallel: {dp: 4, sdp: {mode: forward, coverage: 0.5}}\n");
  const ModelConfig& m = sdp.model;
  const int64_t rows = 2 * 16, C = 16, F = m.ffn_hidden_size(), Fw = F / 2;
  const PassTimes block = cal.block(m, sdp.train, 2, 16), rest = cal.rest(m, sdp.train, 2, 16);
  const PassTimes packed = cal.mlp(rows, C, Fw, false, "f32"),
                  fused = cal.mlp(rows, C, F, true, "f32");
  // The model's corrections, each clamped at zero as it adds them (measured parts may be tiny).
  auto corrected = [](double b, double p, double f) {
    return std::max(0.0, std::max(0.0, b + p) - f);
  };
  check_line(plan_step_time(sdp, cal, links), "compute",
             4 * (corrected(block.fwd, packed.fwd, fused.fwd) +
                  corrected(block.bwd, packed.bwd, fused.bwd)) +
                 rest.total());
  // Parameters: the full model's less the MLP units not held (fc row, bias, proj column).
  const double psi =
      static_cast<double>(count_parameters(m)) - 4.0 * static_cast<double>(F - Fw) * (2 * C + 1);
  check_line(plan_step_time(sdp, cal, links), "optimizer",
             cal.optimizer("adamw", static_cast<int64_t>(psi), "f32"));
  // One bucket of slices (k = 2: 2 steps, byte factor 1 over the 2-rank fit), ready at the end
  // of backward; then the replicated parameters over 4 workers (6 steps, factor 3/2 ÷ 1).
  const double slices = 4.0 * Fw * (2 * C + 1) * 4, replicated = psi * 4 - slices;
  const double want = (1e-4 + slices / 1e8) + (3 * 1e-4 + replicated * 1.5 / 1e8);
  check_line(plan_step_time(sdp, cal, links), "SDP sync", want);
}

// A bucket reduced behind backward costs κ of its time (Note [Overlap cost] in
// train/planner/links.h); κ = 1 makes the overlapped sync cost what the unoverlapped one does.
TEST(PlanTime, AHiddenCollectiveCostsTheMeasuredFractionOfItsTime) {
  Calibration cal;
  auto dp_line = [&](const Config& cfg, double k) {
    ClusterLinks links;
    links.intra = uniform(1e-4, 1e8);
    links.intra.overlap_cost = k;
    for (const TimeLine& l : plan_step_time(cfg, cal, links).lines)
      if (l.what == "dp gradients") return l.seconds;
    ADD_FAILURE() << "no dp gradients line";
    return 0.0;
  };
  const Config overlapped = tiny("parallel: {dp: 2, bucket_mb: 0.001}\n");
  const Config serial = tiny("parallel: {dp: 2, bucket_mb: 0.001, overlap: false}\n");
  const double hidden0 = dp_line(overlapped, 0), full = dp_line(serial, 0);
  EXPECT_LT(hidden0, full);  // backward hides some buckets
  EXPECT_NEAR(dp_line(overlapped, 1), full, 1e-12 + 1e-9 * full);
  EXPECT_NEAR(dp_line(overlapped, 0.5), (hidden0 + full) / 2, 1e-12 + 1e-9 * full);
}

// Note [Buckets on the link] by hand: the head's backward, then blocks that each fill a bucket;
// an early bucket launched after the head; a ring that waits for the link.
TEST(PlanTime, BucketsQueueOnTheLinkAndTheRingWaitsBehindThem) {
  BackwardShape s;
  s.head_bwd = 10;
  s.blocks = 3;
  s.block_bwd = 4;
  s.block_bytes = 100;
  s.bucket_bytes = 100;
  const auto at = [](double seconds_per_byte) {
    return [seconds_per_byte](double n) { return n * seconds_per_byte; };
  };
  // Buckets launched at 14, 18, 22 (the end), each 2 long: only the last runs past backward.
  BackwardSync r = simulate_backward_sync(s, at(0.02));
  EXPECT_DOUBLE_EQ(r.exposed, 2);
  EXPECT_DOUBLE_EQ(r.busy, 6);
  // Each 6 long: they queue (14–20, 20–26, 26–32): 10 past the end at 22.
  r = simulate_backward_sync(s, at(0.06));
  EXPECT_DOUBLE_EQ(r.exposed, 10);
  // A table's 500 bytes after the head (10–20 at 0.02), and an end bucket of 50 bytes: the
  // blocks' buckets queue behind it (20–22, 22–24, 24–26), then the end's (26–27).
  s.early_bytes = 500;
  s.end_bytes = 50;
  r = simulate_backward_sync(s, at(0.02));
  EXPECT_DOUBLE_EQ(r.exposed, 5);
  // A ring whose first hop comes 1 into each block waits for the link: block 1's hop at 11
  // waits until 20 (9), its block ends at 23 and fills a bucket (23–25); block 2's hop at 24
  // waits 1 more, block 2 ends at 28 (28–30); block 3's hop at 29 waits 1, it ends at 33
  // (33–35), and the end's bucket runs 35–36: 3 past backward.
  s.ring_waits = true;
  s.before_ring = 1;
  r = simulate_backward_sync(s, at(0.02));
  EXPECT_DOUBLE_EQ(r.ring_wait, 11);
  EXPECT_DOUBLE_EQ(r.exposed, 3);
  // Without overlap nothing launches before the end (22 without the ring): all 17 after it.
  s.ring_waits = false;
  s.overlap = false;
  r = simulate_backward_sync(s, at(0.02));
  EXPECT_DOUBLE_EQ(r.exposed, 17);
}

// A tall table (vocabulary ≥ 8 × width) on a host at ZeRO 0–1 with overlap (Note [Early
// contributions and sparse rows] in parallel/dp/data_parallel.h): its dense part in a bucket of
// its own after the head, its lookup's rows after backward (a mask, the union's rows and the
// host's measured work); elsewhere (ZeRO-2, a GPU, shortcuts off) plain buckets.
TEST(PlanTime, ATallTableIsReducedEarlyAndByRows) {
  const Config cfg = parse_config_text(
      "model: {arch: gpt2, vocab_size: 1024, vocab_multiple: 64, n_layer: 2, n_head: 2, n_embd: "
      "16, max_seq_len: 64}\n"
      "data: {train: x.bin, batch_size: 2, seq_len: 16}\nparallel: {dp: 2}\n");
  TableSync t = table_sync(cfg, 2 * 16 * 2, 4.0);
  EXPECT_DOUBLE_EQ(t.early_bytes, 1024.0 * 16 * 4);
  EXPECT_DOUBLE_EQ(t.head_bytes, 0);
  EXPECT_DOUBLE_EQ(t.end_bytes, 0);
  ASSERT_EQ(t.rows.size(), 1U);  // wpe: 64 rows are not 8 × 16 tall
  EXPECT_EQ(t.rows[0].rows, 1024);
  EXPECT_EQ(t.rows[0].used, 64);  // the step's tokens over dp
  EXPECT_TRUE(t.rows[0].early);
  // More tokens than half the rows: the lookup is dense, reduced whole at the end.
  t = table_sync(cfg, 600, 4.0);
  EXPECT_TRUE(t.rows.empty());
  EXPECT_DOUBLE_EQ(t.end_bytes, 1024.0 * 16 * 4);
  // An untied head: the head's bucket early, the table's rows without an early part.
  Config untied = cfg;
  untied.model.tie_embeddings = false;
  t = table_sync(untied, 64, 4.0);
  EXPECT_DOUBLE_EQ(t.covered, 2 * 1024.0 * 16 * 4);
  ASSERT_EQ(t.rows.size(), 1U);
  EXPECT_FALSE(t.rows[0].early);
  for (const char* off : {"zero_stage: 2", "table_shortcuts: false", "overlap: false"}) {
    const Config plain = parse_config_text(
        std::string("model: {arch: gpt2, vocab_size: 1024, vocab_multiple: 64, n_layer: 2, ") +
        "n_head: 2, n_embd: 16, max_seq_len: 64}\n"
        "data: {train: x.bin, batch_size: 2, seq_len: 16}\nparallel: {dp: 2, " +
        off + "}\n");
    t = table_sync(plain, 64, 4.0);
    EXPECT_TRUE(t.rows.empty()) << off;
    EXPECT_DOUBLE_EQ(t.early_bytes, 0) << off;
    EXPECT_DOUBLE_EQ(t.end_bytes, 1024.0 * 16 * 4) << off;  // tied: complete at the end
  }
  // The plan's line: the buckets (one, at the end: the blocks' and the rest's; the table's
  // early one hidden by the blocks is at most its own time) plus the rows' collectives and the
  // measured host work.
  Calibration cal;
  ClusterLinks links;
  links.intra = uniform(1e-4, 1e8);
  const StepTimePlan p = plan_step_time(cfg, cal, links);
  const double rows_part = (1e-4 + 1024 * 4.0 / 1e8) + (1e-4 + 64 * 16 * 4.0 / 1e8) +
                           cal.table_rows(1024, 16, 64, true, "f32");
  double line = -1;
  for (const TimeLine& l : p.lines)
    if (l.what == "dp gradients") line = l.seconds;
  const double params = static_cast<double>(count_parameters(cfg.model));
  const double rest_bucket = 1e-4 + (params - 1024.0 * 16) * 4 / 1e8;
  const double early = 1e-4 + 1024.0 * 16 * 4 / 1e8;
  EXPECT_GE(line, rows_part + rest_bucket - 1e-12);
  EXPECT_LE(line, rows_part + rest_bucket + early + 1e-12);
}

TEST(PlanTime, WhatTheModelDoesNotCoverIsNamed) {
  Calibration cal;
  for (const auto& [extra, key] : std::vector<std::pair<std::string, std::string>>{
           {"parallel: {dp: 2, sdp: {mode: backward}}\n", "parallel.sdp.mode"},
           {"parallel: {dp: 2, sdp: {mode: forward, heads: true}}\n", "parallel.sdp.heads"},
           {"parallel: {cp: 2, cp_attention: ulysses}\n", "parallel.cp_attention"},
           {"parallel: {cp: 4, cp_attention: hybrid, cp_ulysses: 2}\n", "parallel.cp_attention"},
           {"parallel: {pp: 2, schedule: zb-v}\noptim: {grad_accum: 2}\n", "parallel.schedule"}}) {
    try {
      plan_step_time(tiny(extra), cal, {});
      FAIL() << key << " must be refused";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(key + ":", 0), 0U) << e.what();
    }
  }
  // The memory plan: Ulysses' buffers (alone or in hybrid) and zb-h1's and zb-v's activations
  // kept from B to W are not modelled (nor, in the step time above, zb-v's V placement).
  for (const auto& [extra, key] : std::vector<std::pair<std::string, std::string>>{
           {"parallel: {cp: 2, cp_attention: ulysses}\n", "parallel.cp_attention"},
           {"parallel: {cp: 4, cp_attention: hybrid, cp_ulysses: 2}\n", "parallel.cp_attention"},
           {"parallel: {pp: 2, schedule: zb-h1}\noptim: {grad_accum: 2}\n", "parallel.schedule"},
           {"parallel: {pp: 2, schedule: zb-v}\noptim: {grad_accum: 2}\n", "parallel.schedule"}}) {
    try {
      plan_memory(tiny(extra), {0, 0, 0, 0});
      FAIL() << key << " must be refused";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(key + ":", 0), 0U) << e.what();
    }
  }
  // Selective recompute (Note [Selective recompute] in core/checkpoint.h): the step time does
  // not price its recomputed ops; the memory plan models its kept results (between full
  // recompute's peak and no recompute's).
  Config selective = tiny();
  selective.model.recompute = "selective";
  try {
    plan_step_time(selective, cal, {});
    FAIL() << "model.recompute: selective must be refused";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("model.recompute:", 0), 0U) << e.what();
  }
  Config full = tiny(), none = tiny();
  full.model.recompute = "full";
  none.model.recompute = "none";
  const int64_t kept = plan_memory(selective, {0, 0, 0, 0}).peak_bytes;
  EXPECT_GT(kept, plan_memory(full, {0, 0, 0, 0}).peak_bytes);
  EXPECT_LE(kept, plan_memory(none, {0, 0, 0, 0}).peak_bytes);
}

}  // namespace
}  // namespace loom::planner
