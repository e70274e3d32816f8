// tests/parallel/pp/pp_schedule_test.cpp — the pipeline schedules' lists alone (no MPI): for many
// (p, v, m) every rank's list simulates without deadlock, forwards precede backwards, sends
// match receives, and the makespan, bubble and peak in-flight activations equal the formulas of
// Note [Pipeline cost model] (parallel/pp/simulate.h), zb-v's against Note [ZB-V] and the other
// schedules (parallel/pp/schedule.h). Also: broken lists are caught, bad
// shapes give errors naming the config key, and the communication order the executor issues
// (Note [Communication order]) runs under NCCL's in-order rules where the naive order
// deadlocks; zb-h1 and zb-v built at op costs (Note [Schedule costs]) keep all of that and are
// no slower at those costs than the unit-cost lists.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "parallel/pp/schedule.h"
#include "parallel/pp/simulate.h"

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
  SCOPED_TRACE(std::string(schedule_name(kind)) + " p=" + std::to_string(p) +
               " v=" + std::to_string(v) + " m=" + std::to_string(m));
  const SimulationResult res = simulate(s, all_lists(kind, s));
  EXPECT_TRUE(res.ok) << res.error;
  if (!res.ok) return res;
  const long units = static_cast<long>(v) * m;
  EXPECT_EQ(res.makespan, 3 * (units + p - 1));
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(res.busy[static_cast<size_t>(r)], 3 * units) << "rank " << r;
    // bubble / makespan = (p−1)/(v·m+p−1), compared exactly as integers.
    EXPECT_EQ((res.makespan - res.busy[static_cast<size_t>(r)]) * (units + p - 1),
              (p - 1) * res.makespan)
        << "rank " << r;
    EXPECT_DOUBLE_EQ(res.bubble_fraction(r),
                     static_cast<double>(p - 1) / static_cast<double>(units + p - 1));
    int peak = m;
    if (kind == ScheduleKind::k1F1B) peak = std::min(m, p - r);
    if (kind == ScheduleKind::kInterleaved)
      peak = static_cast<int>(std::min<long>(units, 2 * (p - r - 1) + (v - 1) * p + 1));
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

// Note [ZB-H1]: the makespan 3m + p − 1 (m ≥ p; 2m + 2p − 1 below), every rank busy 3m units,
// at most min(m, p) micro-batches between FWD and BWD_W on any rank, every W after its B; and
// its bubble a third of 1F1B's at the same (p, m).
TEST(PipelineSchedule, ZeroBubbleH1MatchesFormula) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 5, 8, 13, 16}) {
      SCOPED_TRACE("zb-h1 p=" + std::to_string(p) + " m=" + std::to_string(m));
      const ScheduleShape s{p, 1, m};
      const SimulationResult res = simulate(s, all_lists(ScheduleKind::kZeroBubbleH1, s));
      ASSERT_TRUE(res.ok) << res.error;
      EXPECT_EQ(res.makespan, m >= p ? 3L * m + p - 1 : 2L * m + 2 * p - 1);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(res.busy[static_cast<size_t>(r)], 3L * m) << "rank " << r;
        EXPECT_EQ(res.peak_in_flight[static_cast<size_t>(r)], std::min(m, p)) << "rank " << r;
      }
      int w = 0;
      for (const Instruction& ins : make_schedule(ScheduleKind::kZeroBubbleH1, s, 0))
        w += ins.op == Op::kBwdW ? 1 : 0;
      EXPECT_EQ(w, m);
      if (m >= p && p > 1) {  // idle time: (p − 1) against 1F1B's 3(p − 1)
        const SimulationResult one = simulate(s, all_lists(ScheduleKind::k1F1B, s));
        EXPECT_EQ(3 * (res.makespan - res.busy[0]), one.makespan - one.busy[0]);
      }
    }
  }
}

// Note [Pipeline stages and chunks]: zb-v's V placement — rank r holds stages r and 2p−1−r, so
// rank 0 holds both ends and rank p−1 both middle stages — and the looping one are each one
// map, inverted by stage_rank/stage_chunk.
TEST(PipelineSchedule, StagePlacementsMapStagesToRanks) {
  for (int p : {1, 2, 3, 4, 5}) {
    const ScheduleShape v = schedule_shape(ScheduleKind::kZeroBubbleV, p, 2, 4);
    const ScheduleShape l = schedule_shape(ScheduleKind::kInterleaved, p, 2, 4);
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(v.global_stage(r, 0), r);
      EXPECT_EQ(v.global_stage(r, 1), 2 * p - 1 - r);
      EXPECT_EQ(l.global_stage(r, 1), p + r);
      for (int c = 0; c < 2; ++c) {
        for (const ScheduleShape& s : {v, l}) {
          EXPECT_EQ(s.stage_rank(s.global_stage(r, c)), r);
          EXPECT_EQ(s.stage_chunk(s.global_stage(r, c)), c);
        }
      }
    }
    EXPECT_EQ(v.stage_rank(0), v.stage_rank(2 * p - 1));  // the loss is on rank 0
    EXPECT_EQ(v.stage_rank(p - 1), v.stage_rank(p));      // the turn stays on rank p−1
    EXPECT_EQ(l.stage_rank(2 * p - 1), p - 1);            // looping: the loss on rank p−1
  }
}

// Note [ZB-V], checked in chunk units (F, B and W of a chunk 1 each; a chunk is half a stage):
// every rank busy 6m; makespan 6m + p − 1 for m = p and m ≥ 2p (the least possible: rank p−1
// starts after p−1 forwards), so the idle time is p − 1 chunk units — half ZB-H1's p − 1 stage
// units, a third of interleaved (v 2)'s, a sixth of 1F1B's — and never longer than ZB-H1's
// makespan at any m; at most 2·min(m, p) chunks' activations on any rank (1F1B's peak of
// min(m, p) micro-batches, which its first rank reaches) and exactly that on some rank; W
// passes 2m per rank; the turn p−1 → p is no message, nothing is sent to oneself.
TEST(PipelineSchedule, ZeroBubbleVMatchesFormula) {
  for (int p : {1, 2, 3, 4, 5, 8}) {
    for (int m = 1; m <= 3 * p + 1; ++m) {
      SCOPED_TRACE("zb-v p=" + std::to_string(p) + " m=" + std::to_string(m));
      const ScheduleShape s = schedule_shape(ScheduleKind::kZeroBubbleV, p, 2, m);
      const auto lists = all_lists(ScheduleKind::kZeroBubbleV, s);
      const SimulationResult res = simulate(s, lists);
      ASSERT_TRUE(res.ok) << res.error;
      const ScheduleShape s1{p, 1, m};
      const SimulationResult h1 = simulate(s1, all_lists(ScheduleKind::kZeroBubbleH1, s1));
      const SimulationResult one = simulate(s1, all_lists(ScheduleKind::k1F1B, s1));
      ASSERT_TRUE(h1.ok && one.ok);
      if (m == p || m >= 2 * p) {
        EXPECT_EQ(res.makespan, 6L * m + p - 1);
      }
      EXPECT_LE(res.makespan, 2 * h1.makespan);  // chunk units against stage units
      const int peak = *std::max_element(res.peak_in_flight.begin(), res.peak_in_flight.end());
      EXPECT_EQ(peak, 2 * std::min(m, p));
      EXPECT_LE(peak, 2 * *std::max_element(one.peak_in_flight.begin(), one.peak_in_flight.end()));
      long sends = 0;
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(res.busy[static_cast<size_t>(r)], 6L * m) << "rank " << r;
        int w = 0;
        for (const Instruction& ins : lists[static_cast<size_t>(r)]) {
          w += ins.op == Op::kBwdW ? 1 : 0;
          sends += ins.op == Op::kSendAct ? 1 : 0;
          EXPECT_NE(ins.peer, r) << to_string(ins);
        }
        EXPECT_EQ(w, 2 * m) << "rank " << r;
        if (m >= 2 * p && p > 1) {
          const long idle = res.makespan - res.busy[static_cast<size_t>(r)];
          EXPECT_EQ(idle, p - 1) << "rank " << r;
          EXPECT_EQ(idle, h1.makespan - h1.busy[static_cast<size_t>(r)]);  // half, in stage time
          EXPECT_EQ(6 * idle, 2 * (one.makespan - one.busy[static_cast<size_t>(r)]));
          if (m % p == 0) {
            const ScheduleShape il{p, 2, m};
            const SimulationResult i2 = simulate(il, all_lists(ScheduleKind::kInterleaved, il));
            ASSERT_TRUE(i2.ok) << i2.error;
            EXPECT_EQ(3 * idle, i2.makespan - i2.busy[static_cast<size_t>(r)]);
          }
        }
      }
      EXPECT_EQ(sends, static_cast<long>(m) * (2 * p - 2));  // 2p − 1 hand-offs, one local
    }
  }
  EXPECT_EQ(make_schedule(ScheduleKind::kZeroBubbleV,
                          schedule_shape(ScheduleKind::kZeroBubbleV, 4, 2, 8), 2),
            make_schedule(ScheduleKind::kZeroBubbleV,
                          schedule_shape(ScheduleKind::kZeroBubbleV, 4, 2, 8), 2));
}

// A local hand-off out of order (rank p−1 runs stage p's forward before stage p−1's) and a
// message to oneself are refused.
TEST(PipelineSchedule, SimulatorChecksLocalHandOffs) {
  const ScheduleShape s = schedule_shape(ScheduleKind::kZeroBubbleV, 2, 2, 4);
  const auto lists = all_lists(ScheduleKind::kZeroBubbleV, s);
  ASSERT_TRUE(simulate(s, lists).ok);
  auto early = lists;
  auto& l1 = early[1];
  const auto f0 = std::find(l1.begin(), l1.end(), Instruction{Op::kFwd, 0, 0, -1});
  const auto f1 = std::find(l1.begin(), l1.end(), Instruction{Op::kFwd, 0, 1, -1});
  ASSERT_TRUE(f0 != l1.end() && f1 != l1.end() && f0 < f1);
  std::iter_swap(f0, f1);
  SimulationResult r = simulate(s, early);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("before the forward of stage 1"), std::string::npos) << r.error;
  auto self = lists;
  const auto f = std::find(self[1].begin(), self[1].end(), Instruction{Op::kFwd, 0, 0, -1});
  self[1].insert(f + 1, Instruction{Op::kSendAct, 0, 0, 1});
  r = simulate(s, self);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("no message"), std::string::npos) << r.error;
}

// A split list whose W comes before its B, or is missing, is refused.
TEST(PipelineSchedule, SimulatorChecksWeightPasses) {
  const ScheduleShape s{2, 1, 2};
  auto lists = all_lists(ScheduleKind::kZeroBubbleH1, s);
  auto early = lists;
  auto& l0 = early[0];
  const auto w =
      std::find_if(l0.begin(), l0.end(), [](const Instruction& i) { return i.op == Op::kBwdW; });
  ASSERT_NE(w, l0.end());
  const Instruction moved = *w;
  l0.erase(w);
  l0.insert(l0.begin() + 1, moved);  // right after the first FWD
  EXPECT_NE(simulate(s, early).error.find("W before its backward"), std::string::npos);
  auto missing = lists;
  missing[1].erase(std::find_if(missing[1].begin(), missing[1].end(),
                                [](const Instruction& i) { return i.op == Op::kBwdW; }));
  EXPECT_FALSE(simulate(s, missing).ok);
}

// StageCosts: the default costs (1, 2, no transfer) give the default run exactly; an
// unbalanced pipeline is priced by its slow stage: with stage 0 nearly free, 1F1B over p = 2
// takes stage 0's first forward, m of stage 1's forward + backward, then stage 0's last
// backward, plus the transfers on that path.
TEST(PipelineSchedule, StageCostsPriceEachStage) {
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
                            ScheduleKind::kZeroBubbleH1, ScheduleKind::kZeroBubbleV}) {
    const ScheduleShape s = schedule_shape(
        kind, 2, kind == ScheduleKind::kInterleaved || kind == ScheduleKind::kZeroBubbleV ? 2 : 1,
        4);
    const auto lists = all_lists(kind, s);
    // zb-h1: no wgrad given, W is half of the BWD's 2 units, as in the default run.
    const StageCosts unit{std::vector<long>(static_cast<size_t>(s.num_global_stages()), 1),
                          std::vector<long>(static_cast<size_t>(s.num_global_stages()), 2),
                          0,
                          {}};
    const SimulationResult a = simulate(s, lists), b = simulate(s, lists, &unit);
    ASSERT_TRUE(a.ok && b.ok) << a.error << b.error;
    EXPECT_EQ(a.makespan, b.makespan);
    EXPECT_EQ(a.busy, b.busy);
    EXPECT_EQ(a.time, b.time);
  }
  const ScheduleShape s{2, 1, 4};
  const StageCosts skewed{{1, 100}, {2, 200}, 5, {}};
  const SimulationResult r = simulate(s, all_lists(ScheduleKind::k1F1B, s), &skewed);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.busy[1], 4 * 300);
  EXPECT_EQ(r.makespan, 1 + 5 + 4 * 300 + 5 + 2);
  const StageCosts short_list{{1}, {2}, 0, {}};
  EXPECT_FALSE(simulate(s, all_lists(ScheduleKind::k1F1B, s), &short_list).ok);
}

// Note [Schedule costs]: zb-h1 and zb-v built at non-unit costs (B = 2W, B = 3W, F = B, F > B,
// one with a heavier last stage, and unequal stages drawn at random from a fixed seed), for
// p 2–5 and m from 1 to 4p: every (mb, chunk) runs its
// F, B and W once with their dependencies (simulate() at those costs), without deadlock under
// NCCL's in-order rules either (the issue order taken at the same costs); each chunk's B and W
// passes in micro-batch order (the gradients sum as in the single process); at most 1F1B's
// peak of kept activations; and the makespan at the costs no longer than the unit-cost lists'
// at the same costs — strictly shorter for zb-v at p 4, m 16, F 2 B 3 W 1 (the case the unit
// lists get wrong).
TEST(PipelineSchedule, ZeroBubbleListsFollowCosts) {
  const std::vector<OpCosts> ratios = {{1, 2, 1}, {1, 3, 1}, {2, 3, 1}, {2, 2, 1}, {3, 2, 1}};
  uint64_t seed = 12345;  // a fixed linear congruential sequence: 1..hi
  const auto draw = [&seed](long hi) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return 1 + static_cast<long>((seed >> 33) % static_cast<uint64_t>(hi));
  };
  for (ScheduleKind kind : {ScheduleKind::kZeroBubbleH1, ScheduleKind::kZeroBubbleV}) {
    const int v = default_virtual_stages(kind);
    for (int p = 2; p <= 5; ++p) {
      for (int m : {1, 2, p, 2 * p, 3 * p + 1, 4 * p}) {
        const ScheduleShape s = schedule_shape(kind, p, v, m);
        const size_t S = static_cast<size_t>(s.num_global_stages());
        std::vector<std::vector<OpCosts>> cases;
        for (const OpCosts& c : ratios) cases.emplace_back(S, c);
        cases.push_back(std::vector<OpCosts>(S, {2, 3, 1}));
        cases.back().back() = {5, 7, 2};  // the last stage: the head and the loss
        for (int k = 0; k < 8; ++k) {     // unequal stages: where stage 0 runs ahead, zb-v's chunk
          cases.emplace_back();           // 0 must leave chunk 1 a place (Note [ZB-V])
          for (size_t g = 0; g < S; ++g) cases.back().push_back({draw(20), draw(40), draw(20)});
        }
        for (const std::vector<OpCosts>& costs : cases) {
          const OpCosts& c0 = costs.front();
          SCOPED_TRACE(std::string(schedule_name(kind)) + " p=" + std::to_string(p) +
                       " m=" + std::to_string(m) + " F,B,W " + std::to_string(c0.fwd) + "," +
                       std::to_string(c0.bwd) + "," + std::to_string(c0.wgrad));
          std::vector<std::vector<Instruction>> lists;
          for (int r = 0; r < p; ++r) lists.push_back(make_schedule(kind, s, r, costs));
          const StageCosts priced = stage_costs(s, costs);
          const SimulationResult res = simulate(s, lists, &priced);
          ASSERT_TRUE(res.ok) << res.error;
          const SimulationResult in_order =
              simulate_in_order(s, lists, communication_order(s, lists, &priced));
          EXPECT_TRUE(in_order.ok) << in_order.error;
          const SimulationResult unit = simulate(s, all_lists(kind, s), &priced);
          ASSERT_TRUE(unit.ok) << unit.error;
          EXPECT_LE(res.makespan, unit.makespan);
          for (int r = 0; r < p; ++r) {
            EXPECT_LE(res.peak_in_flight[static_cast<size_t>(r)], v * std::min(m, p));
            long busy = 0;
            for (int c = 0; c < v; ++c) {
              const OpCosts& oc = costs[static_cast<size_t>(s.global_stage(r, c))];
              busy += static_cast<long>(m) * (oc.fwd + oc.bwd + oc.wgrad);
            }
            EXPECT_EQ(res.busy[static_cast<size_t>(r)], busy) << "rank " << r;
            std::vector<int> next_b(static_cast<size_t>(v), 0), next_w(static_cast<size_t>(v), 0);
            for (const Instruction& ins : lists[static_cast<size_t>(r)]) {
              if (ins.op == Op::kBwd) {
                EXPECT_EQ(ins.mb, next_b[static_cast<size_t>(ins.chunk)]++) << to_string(ins);
              } else if (ins.op == Op::kBwdW) {
                EXPECT_EQ(ins.mb, next_w[static_cast<size_t>(ins.chunk)]++) << to_string(ins);
              }
            }
          }
          if (kind == ScheduleKind::kZeroBubbleV && p == 4 && m == 16 && c0 == OpCosts{2, 3, 1} &&
              costs.back() == c0) {
            EXPECT_LT(res.makespan, unit.makespan);
          }
        }
      }
    }
  }
}

// Costs equal on every op give the unit lists (the run is scale-free); the same costs give the
// same lists; costs_from_times scales the largest time to 1000 units and keeps every op at
// least 1; a cost vector of the wrong length is refused.
TEST(PipelineSchedule, ScheduleCostsAreScaleFree) {
  for (ScheduleKind kind : {ScheduleKind::kZeroBubbleH1, ScheduleKind::kZeroBubbleV}) {
    const ScheduleShape s = schedule_shape(kind, 4, default_virtual_stages(kind), 8);
    const size_t S = static_cast<size_t>(s.num_global_stages());
    const std::vector<OpCosts> equal(S, {7, 7, 7}), skewed(S, {2, 3, 1});
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(make_schedule(kind, s, r, equal), make_schedule(kind, s, r));
      EXPECT_EQ(make_schedule(kind, s, r, skewed), make_schedule(kind, s, r, skewed));
    }
    EXPECT_THROW(make_schedule(kind, s, 0, std::vector<OpCosts>(S + 1)), Error);
  }
  // Other schedules' lists do not depend on costs.
  EXPECT_EQ(make_schedule(ScheduleKind::k1F1B, {4, 1, 8}, 1, std::vector<OpCosts>(4, {2, 3, 1})),
            make_schedule(ScheduleKind::k1F1B, {4, 1, 8}, 1));
  const std::vector<OpCosts> want = {{667, 1000, 333}, {1, 500, 1}};
  EXPECT_EQ(costs_from_times({2, 3, 1, 0, 1.5, 1e-6}), want);
  EXPECT_EQ(costs_from_times({2e-3, 3e-3, 1e-3, 0, 1.5e-3, 1e-9}), want);
  EXPECT_THROW(costs_from_times({0, 0, 0}), Error);
}

// parallel.schedule_costs: unit, measured, or three positive ratios; anything else, and costs
// under a schedule that does not split backward, name the key.
TEST(PipelineSchedule, ScheduleCostsParse) {
  EXPECT_EQ(parse_schedule_costs("unit").mode, CostSource::Mode::kUnit);
  EXPECT_EQ(parse_schedule_costs("measured").mode, CostSource::Mode::kMeasured);
  const CostSource given = parse_schedule_costs("2, 3.5,1");
  EXPECT_EQ(given.mode, CostSource::Mode::kGiven);
  EXPECT_EQ(given.given, (std::vector<double>{2, 3.5, 1}));
  EXPECT_EQ(given.costs({2, 1, 4}), (std::vector<OpCosts>(2, {571, 1000, 286})));
  EXPECT_TRUE(parse_schedule_costs("unit").costs({2, 1, 4}).empty());
  for (const char* bad :
       {"", "units", "1,2", "1,2,3,4", "a,b,c", "0,1,1", "-1,2,1", "1,2,1,", "1x,2,1", "nan,1,1"}) {
    try {
      parse_schedule_costs(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("parallel.schedule_costs: ", 0), 0U) << e.what();
    }
  }
  EXPECT_NO_THROW(validate_schedule_costs(ScheduleKind::kZeroBubbleH1, given));
  EXPECT_NO_THROW(validate_schedule_costs(ScheduleKind::k1F1B, parse_schedule_costs("unit")));
  try {
    validate_schedule_costs(ScheduleKind::k1F1B, parse_schedule_costs("measured"));
    ADD_FAILURE() << "measured costs accepted under 1f1b";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.schedule_costs"), std::string::npos);
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
  EXPECT_EQ(make_schedule(ScheduleKind::kInterleaved, s, 1),
            make_schedule(ScheduleKind::kInterleaved, s, 1));
  // 1F1B on the first of 2 stages, 3 micro-batches: one warm-up forward, then 1F1B, cool-down.
  const std::vector<Instruction> l = make_schedule(ScheduleKind::k1F1B, {2, 1, 3}, 0);
  const std::vector<Instruction> want = {
      {Op::kFwd, 0, 0, -1},    {Op::kSendAct, 0, 0, 1},  {Op::kFwd, 1, 0, -1},
      {Op::kSendAct, 1, 0, 1}, {Op::kRecvGrad, 0, 0, 1}, {Op::kBwd, 0, 0, -1},
      {Op::kFwd, 2, 0, -1},    {Op::kSendAct, 2, 0, 1},  {Op::kRecvGrad, 1, 0, 1},
      {Op::kBwd, 1, 0, -1},    {Op::kRecvGrad, 2, 0, 1}, {Op::kBwd, 2, 0, -1}};
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

namespace {

bool is_compute(const Instruction& ins) { return ins.op == Op::kFwd || ins.op == Op::kBwd; }

// The order the executor used before Note [Communication order]: each transfer on its own,
// the receives of the gap after a compute op posted before it, the sends after it.
std::vector<IssuePlan> receive_ahead_plans(const std::vector<std::vector<Instruction>>& lists) {
  std::vector<IssuePlan> plans;
  for (const auto& list : lists) {
    IssuePlan plan;
    std::vector<bool> issued(list.size(), false);
    auto issue = [&](size_t i) {
      if (!issued[i]) plan.push_back({is_compute(list[i]), {static_cast<int>(i)}});
      issued[i] = true;
    };
    for (size_t i = 0; i < list.size(); ++i) {
      if (!is_compute(list[i])) {
        if (list[i].op == Op::kRecvAct || list[i].op == Op::kRecvGrad) issue(i);
        continue;
      }
      for (size_t j = i + 1; j < list.size() && !is_compute(list[j]); ++j) {
        if (list[j].op == Op::kRecvAct || list[j].op == Op::kRecvGrad) issue(j);
      }
      issue(i);
      for (size_t j = i + 1; j < list.size() && !is_compute(list[j]); ++j) {
        if (list[j].op == Op::kSendAct || list[j].op == Op::kSendGrad) issue(j);
      }
    }
    plans.push_back(plan);
  }
  return plans;
}

void check_order(ScheduleKind kind, const ScheduleShape& s) {
  SCOPED_TRACE(std::string(schedule_name(kind)) + " p=" + std::to_string(s.stages) +
               " v=" + std::to_string(s.virtual_stages) + " m=" + std::to_string(s.microbatches));
  const auto lists = all_lists(kind, s);
  const std::vector<IssuePlan> plans = communication_order(s, lists);
  const SimulationResult r = simulate_in_order(s, lists, plans);
  EXPECT_TRUE(r.ok) << r.error;
  for (size_t rank = 0; rank < lists.size(); ++rank) {  // compute ops keep the schedule's order
    std::vector<int> computes;
    for (const IssueStep& step : plans[rank]) {
      if (step.compute) computes.push_back(step.ops.front());
    }
    EXPECT_TRUE(std::is_sorted(computes.begin(), computes.end())) << "rank " << rank;
  }
}

}  // namespace

TEST(PipelineSchedule, CommunicationOrderRunsUnderNcclRules) {
  for (int p = 2; p <= 5; ++p) {
    for (int m = 1; m <= 8; ++m) {
      check_order(ScheduleKind::kGpipe, {p, 1, m});
      check_order(ScheduleKind::k1F1B, {p, 1, m});
    }
    for (int v = 2; v <= 3; ++v) {
      for (int m = p; m <= 3 * p; m += p) check_order(ScheduleKind::kInterleaved, {p, v, m});
    }
    for (int m = 1; m <= 8; ++m) check_order(ScheduleKind::kZeroBubbleH1, {p, 1, m});
    for (int m = 1; m <= 3 * p; ++m)
      check_order(ScheduleKind::kZeroBubbleV, schedule_shape(ScheduleKind::kZeroBubbleV, p, 2, m));
  }
}

TEST(PipelineSchedule, CommunicationOrderGroupsBothDirectionsAndReceivesAhead) {
  // 1F1B, 4 stages, 8 micro-batches: in the steady state a middle rank sends its activation
  // and receives the next gradient in one group, and some receive is issued before the compute
  // op that precedes it in the list (it travels during that compute).
  const ScheduleShape s{4, 1, 8};
  const auto lists = all_lists(ScheduleKind::k1F1B, s);
  const std::vector<IssuePlan> plans = communication_order(s, lists);
  const auto& list = lists[1];
  bool both = false, ahead = false;
  int computes_seen = 0;
  for (const IssueStep& step : plans[1]) {
    if (step.compute) {
      ++computes_seen;
      continue;
    }
    bool send = false, recv = false;
    for (int i : step.ops) {
      const Op op = list[static_cast<size_t>(i)].op;
      send |= op == Op::kSendAct || op == Op::kSendGrad;
      recv |= op == Op::kRecvAct || op == Op::kRecvGrad;
      if (recv) {  // computes before it in the list vs. computes issued so far
        const int before =
            static_cast<int>(std::count_if(list.begin(), list.begin() + i, is_compute));
        ahead |= computes_seen < before;
      }
    }
    both |= send && recv;
  }
  EXPECT_TRUE(both);
  EXPECT_TRUE(ahead);
}

TEST(PipelineSchedule, InOrderSimulatorCatchesUnsafePlans) {
  const ScheduleShape s{2, 1, 2};
  const auto lists = all_lists(ScheduleKind::kGpipe, s);
  const std::vector<IssuePlan> good = communication_order(s, lists);
  ASSERT_TRUE(simulate_in_order(s, lists, good).ok);

  // What MPI tolerates and NCCL does not: receives posted ahead of the sends the peer waits on.
  SimulationResult r = simulate_in_order(s, lists, receive_ahead_plans(lists));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
  // The same for interleaved 1F1B on 2 ranks, where both directions share each pair of ranks.
  const ScheduleShape il{2, 2, 4};
  const auto il_lists = all_lists(ScheduleKind::kInterleaved, il);
  EXPECT_FALSE(simulate_in_order(il, il_lists, receive_ahead_plans(il_lists)).ok);

  // Rank 1 receives mb 1's activation first (in the group that receives mb 0's): NCCL would
  // deliver mb 0's data into mb 1's buffer.
  auto swapped = good;
  auto recv_step = [&](int mb) {
    for (size_t k = 0; k < swapped[1].size(); ++k) {
      for (int i : swapped[1][k].ops) {
        if (lists[1][static_cast<size_t>(i)] == Instruction{Op::kRecvAct, mb, 0, 0}) return k;
      }
    }
    return swapped[1].size();
  };
  const size_t k0 = recv_step(0), k1 = recv_step(1);
  ASSERT_TRUE(k0 < k1 && k1 < swapped[1].size() && swapped[1][k1].ops.size() == 1);
  swapped[1][k0].ops.insert(swapped[1][k0].ops.begin(), swapped[1][k1].ops.front());
  swapped[1].erase(swapped[1].begin() + static_cast<std::ptrdiff_t>(k1));
  r = simulate_in_order(s, lists, swapped);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("received as"), std::string::npos) << r.error;

  // A receive issued after the compute op that needs it.
  auto late = good;
  for (size_t k = 0; k + 1 < late[1].size(); ++k) {
    if (!late[1][k].compute && late[1][k + 1].compute) {
      std::swap(late[1][k], late[1][k + 1]);
      break;
    }
  }
  r = simulate_in_order(s, lists, late);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("after the compute that needs it"), std::string::npos) << r.error;

  // An instruction never issued.
  auto missing = good;
  missing[0].pop_back();
  r = simulate_in_order(s, lists, missing);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("never issued"), std::string::npos) << r.error;
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
  EXPECT_NE(msg(ScheduleKind::kInterleaved, {4, 2, 6}).find("parallel.microbatches"),
            std::string::npos);
  EXPECT_NE(msg(ScheduleKind::k1F1B, {2, 2, 4}).find("parallel.vpp"), std::string::npos);
  EXPECT_NE(msg(ScheduleKind::kGpipe, {2, 1, 0}).find("parallel.microbatches"), std::string::npos);
  EXPECT_THROW(parse_schedule("zb"), ConfigError);
  EXPECT_EQ(parse_schedule("1f1b"), ScheduleKind::k1F1B);
  EXPECT_EQ(parse_schedule("zb-v"), ScheduleKind::kZeroBubbleV);
  for (int v : {1, 3}) {
    EXPECT_EQ(msg(ScheduleKind::kZeroBubbleV, schedule_shape(ScheduleKind::kZeroBubbleV, 2, v, 4))
                  .rfind("parallel.vpp: zb-v runs 2 chunks per rank", 0),
              0U);
  }
  // A shape built for another placement is an internal error, not a user's.
  EXPECT_THROW(make_schedule(ScheduleKind::kZeroBubbleV, {2, 2, 4}, 0), Error);
}

}  // namespace
}  // namespace loom::parallel::pp
