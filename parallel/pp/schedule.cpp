// parallel/pp/schedule.cpp — the schedule generators (see parallel/pp/schedule.h). Pure
// functions: no communication, no tensors.
#include "parallel/pp/schedule.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <sstream>

#include "core/error.h"
#include "parallel/pp/simulate.h"

namespace loom::parallel::pp {

const char* op_name(Op op) {
  switch (op) {
    case Op::kFwd:
      return "FWD";
    case Op::kBwd:
      return "BWD";
    case Op::kSendAct:
      return "SEND_ACT";
    case Op::kRecvAct:
      return "RECV_ACT";
    case Op::kSendGrad:
      return "SEND_GRAD";
    case Op::kRecvGrad:
      return "RECV_GRAD";
    case Op::kBwdW:
      return "BWD_W";
  }
  return "?";
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGpipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZeroBubbleH1:
      return "zb-h1";
    case ScheduleKind::kZeroBubbleV:
      return "zb-v";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGpipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  if (name == "zb-h1") return ScheduleKind::kZeroBubbleH1;
  if (name == "zb-v") return ScheduleKind::kZeroBubbleV;
  throw ConfigError("parallel.schedule: unknown schedule '" + name +
                    "' (expected gpipe, 1f1b, interleaved, zb-h1 or zb-v)");
}

std::string to_string(const Instruction& ins) {
  std::ostringstream os;
  os << op_name(ins.op) << " mb " << ins.mb << " chunk " << ins.chunk;
  if (ins.op == Op::kSendAct || ins.op == Op::kSendGrad) os << " to " << ins.peer;
  if (ins.op == Op::kRecvAct || ins.op == Op::kRecvGrad) os << " from " << ins.peer;
  return os.str();
}

void validate_schedule(ScheduleKind kind, const ScheduleShape& s) {
  LOOM_CONFIG_CHECK(s.stages >= 1, "parallel.pp: must be >= 1, got ", s.stages);
  LOOM_CONFIG_CHECK(s.virtual_stages >= 1, "parallel.vpp: must be >= 1, got ", s.virtual_stages);
  LOOM_CONFIG_CHECK(s.microbatches >= 1, "parallel.microbatches: must be >= 1, got ",
                    s.microbatches);
  LOOM_CHECK(s.placement == stage_placement(kind),
             "pipeline: a shape placed for another schedule "
             "than ",
             schedule_name(kind), " (build it with schedule_shape())");
  if (kind == ScheduleKind::kZeroBubbleV) {
    LOOM_CONFIG_CHECK(s.virtual_stages == 2,
                      "parallel.vpp: zb-v runs 2 chunks per rank (chunks r "
                      "and 2·pp−1−r, Note [ZB-V]); leave parallel.vpp at 1 or set 2, got ",
                      s.virtual_stages);
  } else if (kind != ScheduleKind::kInterleaved) {  // gpipe, 1f1b, zb-h1
    LOOM_CONFIG_CHECK(s.virtual_stages == 1, "parallel.vpp: ", s.virtual_stages,
                      " virtual stages need parallel.schedule: interleaved (", schedule_name(kind),
                      " runs one chunk per rank)");
  } else {
    LOOM_CONFIG_CHECK(s.microbatches % s.stages == 0, "parallel.microbatches: ", s.microbatches,
                      " is not a multiple of parallel.pp ", s.stages,
                      " (the interleaved schedule needs m % pp == 0)");
  }
}

namespace {

struct Unit {
  Op op;  // kFwd, kBwd or kBwdW
  int mb, chunk;
};

// The cost of global stage g's ops (Note [Schedule costs]): unit costs when none are given.
const OpCosts& stage_cost(const std::vector<OpCosts>& costs, int g) {
  static constexpr OpCosts kUnit{};
  return costs.empty() ? kUnit : costs[static_cast<size_t>(g)];
}

// The next time after t at which a rank finishes an op (every arrival is such a time), or fails:
// no rank is busy after t but `left` ops remain.
long next_event(const std::vector<long>& free_at, long t, size_t left, const char* kind,
                const ScheduleShape& s) {
  long next = -1;
  for (long f : free_at) {
    if (f > t && (next < 0 || f < next)) next = f;
  }
  LOOM_CHECK(left == 0 || next >= 0, kind, ": the greedy schedule did not finish (p ", s.stages,
             ", m ", s.microbatches, ")");
  return next;
}

// Note [ZB-H1] in the header: every rank's compute order from one greedy run at the costs
// (Note [Schedule costs]).
std::vector<std::vector<Unit>> zero_bubble_h1(const ScheduleShape& s,
                                              const std::vector<OpCosts>& costs) {
  const int p = s.stages, m = s.microbatches;
  constexpr long kNever = -1;
  // act[r][mb]: when mb's activation is at rank r (rank 0: at once); grad[r][mb]: its gradient.
  std::vector<std::vector<long>> act(p, std::vector<long>(m, kNever)),
      grad(p, std::vector<long>(m, kNever));
  for (int mb = 0; mb < m; ++mb) act[0][mb] = 0;
  struct Rank {
    int next_f = 0, next_b = 0, in_flight = 0;
    std::deque<int> pending_w;
  };
  std::vector<Rank> rs(p);
  std::vector<long> free_at(static_cast<size_t>(p), 0);
  std::vector<std::vector<Unit>> out(p);
  const auto arrived = [](long at, long t) { return at != kNever && at <= t; };
  size_t left = static_cast<size_t>(3 * m * p);
  for (long t = 0; left > 0; t = next_event(free_at, t, left, "zb-h1", s)) {
    for (int r = 0; r < p; ++r) {
      Rank& k = rs[r];
      if (free_at[static_cast<size_t>(r)] > t) continue;
      const OpCosts& c = stage_cost(costs, r);
      long end = 0;
      if (k.next_f < m && arrived(act[r][k.next_f], t) && k.next_f - k.next_b < p - r &&
          k.in_flight < p) {
        const int mb = k.next_f++;
        out[r].push_back({Op::kFwd, mb, 0});
        ++k.in_flight;
        end = t + c.fwd;
        if (r + 1 < p)
          act[r + 1][mb] = end;
        else
          grad[r][mb] = end;  // the last stage's loss: its B can follow
      } else if (k.next_b < k.next_f && arrived(grad[r][k.next_b], t)) {
        const int mb = k.next_b++;
        out[r].push_back({Op::kBwd, mb, 0});
        k.pending_w.push_back(mb);
        end = t + c.bwd;
        if (r > 0) grad[r - 1][mb] = end;
      } else if (!k.pending_w.empty()) {
        out[r].push_back({Op::kBwdW, k.pending_w.front(), 0});
        k.pending_w.pop_front();
        --k.in_flight;
        end = t + c.wgrad;
      } else {
        continue;  // waits
      }
      free_at[static_cast<size_t>(r)] = end;
      --left;
    }
  }
  return out;
}

// Note [ZB-V] in the header: every rank's compute order from one greedy run at the costs (a
// chunk's F, B and W; Note [Schedule costs]).
std::vector<std::vector<Unit>> zero_bubble_v(const ScheduleShape& s,
                                             const std::vector<OpCosts>& costs) {
  const int p = s.stages, m = s.microbatches, S = s.num_global_stages();
  constexpr long kNever = -1;
  // act[g][mb]: when mb's activation is at global stage g (stage 0: at once); grad[g][mb]: when
  // the gradient of stage g's output is (the last stage: after its own F).
  std::vector<std::vector<long>> act(static_cast<size_t>(S), std::vector<long>(m, kNever)),
      grad(static_cast<size_t>(S), std::vector<long>(m, kNever));
  for (int mb = 0; mb < m; ++mb) act[0][static_cast<size_t>(mb)] = 0;
  struct Rank {
    int next_f[2] = {0, 0}, next_b[2] = {0, 0}, in_flight = 0, in_flight0 = 0;  // 0: chunk 0's
    std::deque<std::pair<int, int>> pending_w;  // (chunk, mb), in B order
  };
  std::vector<Rank> rs(static_cast<size_t>(p));
  std::vector<long> free_at(static_cast<size_t>(p), 0);
  std::vector<std::vector<Unit>> out(static_cast<size_t>(p));
  const auto arrived = [](long at, long t) { return at != kNever && at <= t; };
  const auto at = [](std::vector<std::vector<long>>& v, int g, int mb) -> long& {
    return v[static_cast<size_t>(g)][static_cast<size_t>(mb)];
  };
  // Chunk 0 leaves one place of the bound to chunk 1 (Note [ZB-V]); a single rank needs none.
  const int cap0 = p > 1 ? 2 * p - 1 : 2;
  size_t left = static_cast<size_t>(6 * m * p);
  for (long t = 0; left > 0; t = next_event(free_at, t, left, "zb-v", s)) {
    for (int r = 0; r < p; ++r) {
      Rank& k = rs[static_cast<size_t>(r)];
      if (free_at[static_cast<size_t>(r)] > t) continue;
      int f_chunk = -1, b_chunk = -1;
      for (int c : {1, 0}) {  // F: the chunk nearer the loss first
        const int mb = k.next_f[c];
        if (f_chunk < 0 && mb < m && k.in_flight < 2 * p && (c == 1 || k.in_flight0 < cap0) &&
            arrived(at(act, s.global_stage(r, c), mb), t))
          f_chunk = c;
      }
      for (int c : {0, 1}) {  // B: chunk 0 first (its gradient frees the previous rank)
        const int mb = k.next_b[c];
        if (b_chunk < 0 && mb < k.next_f[c] && arrived(at(grad, s.global_stage(r, c), mb), t))
          b_chunk = c;
      }
      long end = 0;
      if (f_chunk >= 0) {
        const int mb = k.next_f[f_chunk]++, g = s.global_stage(r, f_chunk);
        out[static_cast<size_t>(r)].push_back({Op::kFwd, mb, f_chunk});
        ++k.in_flight;
        if (f_chunk == 0) ++k.in_flight0;
        end = t + stage_cost(costs, g).fwd;
        if (g + 1 < S)
          at(act, g + 1, mb) = end;
        else
          at(grad, g, mb) = end;  // the last stage's loss: its B can follow
      } else if (b_chunk >= 0) {
        const int mb = k.next_b[b_chunk]++, g = s.global_stage(r, b_chunk);
        out[static_cast<size_t>(r)].push_back({Op::kBwd, mb, b_chunk});
        k.pending_w.emplace_back(b_chunk, mb);
        end = t + stage_cost(costs, g).bwd;
        if (g > 0) at(grad, g - 1, mb) = end;
      } else if (!k.pending_w.empty()) {
        const auto [c, mb] = k.pending_w.front();
        out[static_cast<size_t>(r)].push_back({Op::kBwdW, mb, c});
        k.pending_w.pop_front();
        --k.in_flight;
        if (c == 0) --k.in_flight0;
        end = t + stage_cost(costs, s.global_stage(r, c)).wgrad;
      } else {
        continue;  // waits
      }
      free_at[static_cast<size_t>(r)] = end;
      --left;
    }
  }
  return out;
}

// `order` with its transfers (Note [Instruction lists] in the header).
std::vector<Instruction> with_transfers(const ScheduleShape& s, int rank,
                                        const std::vector<Unit>& order) {
  const int last = s.num_global_stages() - 1;
  std::vector<Instruction> out;
  for (const Unit& u : order) {
    const int g = s.global_stage(rank, u.chunk);
    // The ranks of stages g−1 and g+1, where there is one on another rank (a hand-off on this
    // rank is no message: Note [Instruction lists]).
    const int prev = g > 0 && s.stage_rank(g - 1) != rank ? s.stage_rank(g - 1) : -1;
    const int next = g < last && s.stage_rank(g + 1) != rank ? s.stage_rank(g + 1) : -1;
    if (u.op == Op::kFwd) {
      if (prev >= 0) out.push_back({Op::kRecvAct, u.mb, u.chunk, prev});
      out.push_back({Op::kFwd, u.mb, u.chunk, -1});
      if (next >= 0) out.push_back({Op::kSendAct, u.mb, u.chunk, next});
    } else if (u.op == Op::kBwdW) {
      out.push_back({Op::kBwdW, u.mb, u.chunk, -1});
    } else {
      if (next >= 0) out.push_back({Op::kRecvGrad, u.mb, u.chunk, next});
      out.push_back({Op::kBwd, u.mb, u.chunk, -1});
      if (prev >= 0) out.push_back({Op::kSendGrad, u.mb, u.chunk, prev});
    }
  }
  return out;
}

// Note [Schedule costs] in the header: the greedy run at the costs, or the one at unit costs
// where that one's makespan at the costs is shorter.
std::vector<std::vector<Unit>> zero_bubble(ScheduleKind kind, const ScheduleShape& s,
                                           const std::vector<OpCosts>& costs) {
  const auto run = [&](const std::vector<OpCosts>& c) {
    return kind == ScheduleKind::kZeroBubbleH1 ? zero_bubble_h1(s, c) : zero_bubble_v(s, c);
  };
  std::vector<std::vector<Unit>> built = run(costs);
  if (costs.empty()) return built;
  std::vector<std::vector<Unit>> unit = run({});
  const StageCosts priced = stage_costs(s, costs);
  const auto makespan = [&](const std::vector<std::vector<Unit>>& orders) {
    std::vector<std::vector<Instruction>> lists;
    for (int r = 0; r < s.stages; ++r)
      lists.push_back(with_transfers(s, r, orders[static_cast<size_t>(r)]));
    const SimulationResult res = simulate(s, lists, &priced);
    LOOM_CHECK(res.ok, schedule_name(kind), ": the greedy lists do not simulate: ", res.error);
    return res.makespan;
  };
  return makespan(unit) < makespan(built) ? unit : built;
}

// The compute order of `rank` (Note [Instruction lists] in the header).
std::vector<Unit> compute_order(ScheduleKind kind, const ScheduleShape& s, int rank,
                                const std::vector<OpCosts>& costs) {
  if (splits_backward(kind)) return zero_bubble(kind, s, costs)[static_cast<size_t>(rank)];
  const int p = s.stages, v = s.virtual_stages, m = s.microbatches, n = v * m;
  auto fwd_unit = [&](int k) {
    if (kind != ScheduleKind::kInterleaved) return Unit{Op::kFwd, k, 0};
    return Unit{Op::kFwd, (k / (p * v)) * p + k % p, (k / p) % v};
  };
  auto bwd_unit = [&](int k) {
    if (kind != ScheduleKind::kInterleaved) return Unit{Op::kBwd, k, 0};
    return Unit{Op::kBwd, (k / (p * v)) * p + k % p, v - 1 - (k / p) % v};
  };
  int warmup = n;  // GPipe: every forward first
  if (kind == ScheduleKind::k1F1B) warmup = std::min(p - rank - 1, n);
  if (kind == ScheduleKind::kInterleaved) warmup = std::min(2 * (p - rank - 1) + (v - 1) * p, n);
  std::vector<Unit> out;
  for (int k = 0; k < warmup; ++k) out.push_back(fwd_unit(k));
  for (int k = 0; k < n - warmup; ++k) {
    out.push_back(fwd_unit(warmup + k));
    out.push_back(bwd_unit(k));
  }
  for (int k = n - warmup; k < n; ++k) out.push_back(bwd_unit(k));
  return out;
}

}  // namespace

std::vector<OpCosts> costs_from_times(const std::vector<double>& fbw) {
  LOOM_CHECK(!fbw.empty() && fbw.size() % 3 == 0, "pipeline: ", fbw.size(),
             " op times, expected F, B and W per stage");
  double top = 0;
  for (double x : fbw) {
    LOOM_CHECK(x >= 0 && std::isfinite(x), "pipeline: an op time of ", x);
    top = std::max(top, x);
  }
  LOOM_CHECK(top > 0, "pipeline: every op time is 0");
  const auto units = [&](double x) { return std::max(1L, std::lround(x / top * 1000.0)); };
  std::vector<OpCosts> out;
  for (size_t i = 0; i < fbw.size(); i += 3)
    out.push_back({units(fbw[i]), units(fbw[i + 1]), units(fbw[i + 2])});
  return out;
}

std::vector<OpCosts> CostSource::costs(const ScheduleShape& shape) const {
  if (mode != Mode::kGiven) return {};
  std::vector<double> fbw;
  for (int g = 0; g < shape.num_global_stages(); ++g)
    fbw.insert(fbw.end(), given.begin(), given.end());
  return costs_from_times(fbw);
}

CostSource parse_schedule_costs(const std::string& text) {
  if (text == "unit") return {};
  if (text == "measured") return {CostSource::Mode::kMeasured, {}};
  const std::string expected =
      "parallel.schedule_costs: expected unit, measured or three positive "
      "ratios \"F,B,W\" (e.g. \"1,2,1\"), got '" +
      text + "'";
  CostSource out{CostSource::Mode::kGiven, {}};
  std::istringstream is(text);
  std::string part;
  while (std::getline(is, part, ',')) {
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(part, &used);
    } catch (const std::exception&) {
      throw ConfigError(expected);
    }
    while (used < part.size() && part[used] == ' ') ++used;
    LOOM_CONFIG_CHECK(used == part.size() && x > 0 && std::isfinite(x), expected);
    out.given.push_back(x);
  }
  LOOM_CONFIG_CHECK(out.given.size() == 3 && text.back() != ',', expected);
  return out;
}

void validate_schedule_costs(ScheduleKind kind, const CostSource& costs) {
  LOOM_CONFIG_CHECK(costs.mode == CostSource::Mode::kUnit || splits_backward(kind),
                    "parallel.schedule_costs: only zb-h1 and zb-v build their lists from op costs "
                    "(parallel.schedule is ",
                    schedule_name(kind), "); leave it at unit");
}

std::vector<Instruction> make_schedule(ScheduleKind kind, const ScheduleShape& s, int rank,
                                       const std::vector<OpCosts>& costs) {
  validate_schedule(kind, s);
  LOOM_CHECK(rank >= 0 && rank < s.stages, "make_schedule: rank ", rank, " outside [0, ", s.stages,
             ")");
  LOOM_CHECK(costs.empty() || costs.size() == static_cast<size_t>(s.num_global_stages()),
             "make_schedule: ", costs.size(), " stage costs for ", s.num_global_stages(),
             " stages");
  for (const OpCosts& c : costs) {
    LOOM_CHECK(c.fwd >= 1 && c.bwd >= 1 && c.wgrad >= 1,
               "make_schedule: op costs must be at least 1");
  }
  return with_transfers(s, rank, compute_order(kind, s, rank, costs));
}

int message_tag(const ScheduleShape& s, bool grad, int mb, int recv_stage) {
  const int S = s.num_global_stages();
  LOOM_CHECK(2L * s.microbatches * S < 32768L, "pipeline: ", s.microbatches, " micro-batches × ", S,
             " stages exceed the MPI tag space (2·m·S must stay below 32768)");
  return (mb * S + recv_stage) * 2 + (grad ? 1 : 0);
}

}  // namespace loom::parallel::pp
