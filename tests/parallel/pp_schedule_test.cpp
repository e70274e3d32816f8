// tests/parallel/pp_schedule_test.cpp — the pipeline schedules' lists alone (no MPI): for many
// (p, v, m) every rank's list simulates without deadlock, forwards precede backwards, sends
// match receives, and the makespan, bubble and peak in-flight activations equal the formulas of
// Note [Pipeline cost model] (parallel/pp/schedule.h). Also: broken lists are caught, and bad
// shapes give errors naming the config key.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "parallel/pp/schedule.h"

namespace loom::parallel::pp {
namespace {

std::vector<std::vector<Instruction>> all_lists(ScheduleKind kind, const ScheduleShape& s) {
  std::vector<std::vector<Instruction>> lists;
  for (int r = 0; r < s.stages; ++r) lists.push_back(make_schedule(kind, s, r));
  return lists;
}

// Checks the simulation and the formulas; returns the result for further checks.
SimulationResult check(ScheduleKind kind, const ScheduleShape& s) {
  const int p = s.stages, v = s.virtual_stages, m = s.microbatches;
  SCOPED_TRACE(std::string(schedule_name(kind)) + " p=" + std::to_string(p) + " v=" + std::to_string(v) +
               " m=" + std::to_string(m));
  const SimulationResult res = simulate(s, all_lists(kind, s));
  EXPECT_TRUE(res.ok) << res.error;
  if (!res.ok) return res;
  const long units = static_cast<long>(v) * m;
  EXPECT_EQ(res.makespan, 3 * (units + p - 1));
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(res.busy[static_cast<size_t>(r)], 3 * units) << "rank " << r;
    // bubble / makespan = (p−1)/(v·m+p−1), compared exactly as integers.
    EXPECT_EQ((res.makespan - res.busy[static_cast<size_t>(r)]) * (units + p - 1), (p - 1) * res.makespan) << "rank " << r;
    EXPECT_DOUBLE_EQ(res.bubble_fraction(r), static_cast<double>(p - 1) / static_cast<double>(units + p - 1));
    int peak = m;
    if (kind == ScheduleKind::k1F1B) peak = std::min(m, p - r);
    if (kind == ScheduleKind::kInterleaved) peak = static_cast<int>(std::min<long>(units, 2 * (p - r - 1) + (v - 1) * p + 1));
    EXPECT_EQ(res.peak_in_flight[static_cast<size_t>(r)], peak) << "rank " << r;
  }
  return res;
}

TEST(PipelineSchedule, GpipeAndOneFOneBMatchFormulas) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 5, 8, 13, 16}) {
      check(ScheduleKind::kGpipe, {p, 1, m});
      check(ScheduleKind::k1F1B, {p, 1, m});
    }
  }
}

TEST(PipelineSchedule, InterleavedMatchesFormula) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int v : {1, 2, 3, 4}) {
      for (int k : {1, 2, 3, 4}) check(ScheduleKind::kInterleaved, {p, v, k * p});
    }
  }
}

TEST(PipelineSchedule, OneFOneBHoldsFewerActivationsThanGpipe) {
  const ScheduleShape s{4, 1, 16};
  const SimulationResult g = check(ScheduleKind::kGpipe, s), f = check(ScheduleKind::k1F1B, s);
  ASSERT_TRUE(g.ok && f.ok);
  EXPECT_EQ(g.peak_in_flight[0], 16);
  EXPECT_EQ(f.peak_in_flight[0], 4);
  EXPECT_EQ(f.peak_in_flight[3], 1);
}

TEST(PipelineSchedule, ListsArePureAndShaped) {
  const ScheduleShape s{4, 2, 8};
  EXPECT_EQ(make_schedule(ScheduleKind::kInterleaved, s, 1), make_schedule(ScheduleKind::kInterleaved, s, 1));
  // 1F1B on the first of 2 stages, 3 micro-batches: one warm-up forward, then 1F1B, cool-down.
  const std::vector<Instruction> l = make_schedule(ScheduleKind::k1F1B, {2, 1, 3}, 0);
  const std::vector<Instruction> want = {
      {Op::kFwd, 0, 0, -1},      {Op::kSendAct, 0, 0, 1}, {Op::kFwd, 1, 0, -1},      {Op::kSendAct, 1, 0, 1},
      {Op::kRecvGrad, 0, 0, 1},  {Op::kBwd, 0, 0, -1},    {Op::kFwd, 2, 0, -1},      {Op::kSendAct, 2, 0, 1},
      {Op::kRecvGrad, 1, 0, 1},  {Op::kBwd, 1, 0, -1},    {Op::kRecvGrad, 2, 0, 1},  {Op::kBwd, 2, 0, -1}};
  EXPECT_EQ(l, want);
  // The last stage never sends activations nor receives gradients.
  for (const Instruction& ins : make_schedule(ScheduleKind::k1F1B, {2, 1, 3}, 1)) {
    EXPECT_NE(ins.op, Op::kSendAct);
    EXPECT_NE(ins.op, Op::kRecvGrad);
  }
}

TEST(PipelineSchedule, SimulatorCatchesBrokenLists) {
  const ScheduleShape s{2, 1, 2};
  auto lists = all_lists(ScheduleKind::k1F1B, s);
  ASSERT_TRUE(simulate(s, lists).ok);

  // Rank 0 waits for a gradient before sending the activation that produces it: deadlock.
  auto dead = lists;
  std::swap(dead[0][1], dead[0][4]);  // SEND_ACT mb 0 ↔ RECV_GRAD mb 0
  SimulationResult r = simulate(s, dead);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;

  // Receives in the wrong order.
  auto order = lists;
  auto& l1 = order[1];
  auto first = std::find(l1.begin(), l1.end(), Instruction{Op::kRecvAct, 0, 0, 0});
  auto second = std::find(l1.begin(), l1.end(), Instruction{Op::kRecvAct, 1, 0, 0});
  ASSERT_TRUE(first != l1.end() && second != l1.end());
  std::iter_swap(first, second);
  r = simulate(s, order);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("out of order"), std::string::npos) << r.error;

  // Backward before forward.
  auto early = lists;
  std::swap(early[1][1], early[1][2]);  // FWD mb 0 ↔ BWD mb 0 on the last stage
  r = simulate(s, early);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("before its forward"), std::string::npos) << r.error;

  // A send nobody receives.
  auto extra = lists;
  extra[0].push_back({Op::kSendAct, 1, 0, 1});
  EXPECT_FALSE(simulate(s, extra).ok);
}

TEST(PipelineSchedule, BadShapesNameTheKey) {
  auto msg = [](ScheduleKind k, ScheduleShape s) {
    try {
      make_schedule(k, s, 0);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(ScheduleKind::kInterleaved, {4, 2, 6}).find("parallel.microbatches"), std::string::npos);
  EXPECT_NE(msg(ScheduleKind::k1F1B, {2, 2, 4}).find("parallel.vpp"), std::string::npos);
  EXPECT_NE(msg(ScheduleKind::kGpipe, {2, 1, 0}).find("parallel.microbatches"), std::string::npos);
  EXPECT_THROW(parse_schedule("zb"), ConfigError);
  EXPECT_EQ(parse_schedule("1f1b"), ScheduleKind::k1F1B);
}

}  // namespace
}  // namespace loom::parallel::pp
