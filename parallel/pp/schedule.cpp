// parallel/pp/schedule.cpp — the schedule generators (see parallel/pp/schedule.h). Pure
// functions: no communication, no tensors.
#include "parallel/pp/schedule.h"

#include <algorithm>
#include <deque>
#include <sstream>

#include "core/error.h"

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

// Note [ZB-H1] in the header: every rank's compute order from one greedy run at unit costs.
std::vector<std::vector<Unit>> zero_bubble_h1(const ScheduleShape& s) {
  const int p = s.stages, m = s.microbatches;
  constexpr long kNever = -1;
  // act[r][mb]: when mb's activation is at rank r (rank 0: at once); grad[r][mb]: its gradient.
  std::vector<std::vector<long>> act(p, std::vector<long>(m, kNever)),
      grad(p, std::vector<long>(m, kNever));
  for (int mb = 0; mb < m; ++mb) act[0][mb] = 0;
  struct Rank {
    int next_f = 0, next_b = 0, in_flight = 0;
    std::deque<int> pending_w;
    long free_at = 0;
  };
  std::vector<Rank> rs(p);
  std::vector<std::vector<Unit>> out(p);
  const auto arrived = [](long at, long t) { return at != kNever && at <= t; };
  size_t left = static_cast<size_t>(3 * m * p);
  for (long t = 0; left > 0; ++t) {
    LOOM_CHECK(t <= 3L * (m + p) * p, "zb-h1: the greedy schedule did not finish (p ", p, ", m ", m,
               ")");
    for (int r = 0; r < p; ++r) {
      Rank& k = rs[r];
      if (k.free_at > t) continue;
      if (k.next_f < m && arrived(act[r][k.next_f], t) && k.next_f - k.next_b < p - r &&
          k.in_flight < p) {
        const int mb = k.next_f++;
        out[r].push_back({Op::kFwd, mb, 0});
        ++k.in_flight;
        if (r + 1 < p)
          act[r + 1][mb] = t + 1;
        else
          grad[r][mb] = t + 1;  // the last stage's loss: its B can follow
      } else if (k.next_b < k.next_f && arrived(grad[r][k.next_b], t)) {
        const int mb = k.next_b++;
        out[r].push_back({Op::kBwd, mb, 0});
        k.pending_w.push_back(mb);
        if (r > 0) grad[r - 1][mb] = t + 1;
      } else if (!k.pending_w.empty()) {
        out[r].push_back({Op::kBwdW, k.pending_w.front(), 0});
        k.pending_w.pop_front();
        --k.in_flight;
      } else {
        continue;  // waits
      }
      k.free_at = t + 1;
      --left;
    }
  }
  return out;
}

// Note [ZB-V] in the header: every rank's compute order from one greedy run at unit costs (a
// chunk's F, B and W one unit each).
std::vector<std::vector<Unit>> zero_bubble_v(const ScheduleShape& s) {
  const int p = s.stages, m = s.microbatches, S = s.num_global_stages();
  constexpr long kNever = -1;
  // act[g][mb]: when mb's activation is at global stage g (stage 0: at once); grad[g][mb]: when
  // the gradient of stage g's output is (the last stage: after its own F).
  std::vector<std::vector<long>> act(static_cast<size_t>(S), std::vector<long>(m, kNever)),
      grad(static_cast<size_t>(S), std::vector<long>(m, kNever));
  for (int mb = 0; mb < m; ++mb) act[0][static_cast<size_t>(mb)] = 0;
  struct Rank {
    int next_f[2] = {0, 0}, next_b[2] = {0, 0}, in_flight = 0;
    std::deque<std::pair<int, int>> pending_w;  // (chunk, mb), in B order
    long free_at = 0;
  };
  std::vector<Rank> rs(static_cast<size_t>(p));
  std::vector<std::vector<Unit>> out(static_cast<size_t>(p));
  const auto arrived = [](long at, long t) { return at != kNever && at <= t; };
  const auto at = [](std::vector<std::vector<long>>& v, int g, int mb) -> long& {
    return v[static_cast<size_t>(g)][static_cast<size_t>(mb)];
  };
  size_t left = static_cast<size_t>(6 * m * p);
  for (long t = 0; left > 0; ++t) {
    LOOM_CHECK(t <= 6L * (m + p) * p, "zb-v: the greedy schedule did not finish (p ", p, ", m ", m,
               ")");
    for (int r = 0; r < p; ++r) {
      Rank& k = rs[static_cast<size_t>(r)];
      if (k.free_at > t) continue;
      int f_chunk = -1, b_chunk = -1;
      for (int c : {1, 0}) {  // F: the chunk nearer the loss first
        const int mb = k.next_f[c];
        if (f_chunk < 0 && mb < m && k.in_flight < 2 * p &&
            arrived(at(act, s.global_stage(r, c), mb), t))
          f_chunk = c;
      }
      for (int c : {0, 1}) {  // B: chunk 0 first (its gradient frees the previous rank)
        const int mb = k.next_b[c];
        if (b_chunk < 0 && mb < k.next_f[c] && arrived(at(grad, s.global_stage(r, c), mb), t))
          b_chunk = c;
      }
      if (f_chunk >= 0) {
        const int mb = k.next_f[f_chunk]++, g = s.global_stage(r, f_chunk);
        out[static_cast<size_t>(r)].push_back({Op::kFwd, mb, f_chunk});
        ++k.in_flight;
        if (g + 1 < S)
          at(act, g + 1, mb) = t + 1;
        else
          at(grad, g, mb) = t + 1;  // the last stage's loss: its B can follow
      } else if (b_chunk >= 0) {
        const int mb = k.next_b[b_chunk]++, g = s.global_stage(r, b_chunk);
        out[static_cast<size_t>(r)].push_back({Op::kBwd, mb, b_chunk});
        k.pending_w.emplace_back(b_chunk, mb);
        if (g > 0) at(grad, g - 1, mb) = t + 1;
      } else if (!k.pending_w.empty()) {
        const auto [c, mb] = k.pending_w.front();
        out[static_cast<size_t>(r)].push_back({Op::kBwdW, mb, c});
        k.pending_w.pop_front();
        --k.in_flight;
      } else {
        continue;  // waits
      }
      k.free_at = t + 1;
      --left;
    }
  }
  return out;
}

// The compute order of `rank` (Note [Instruction lists] in the header).
std::vector<Unit> compute_order(ScheduleKind kind, const ScheduleShape& s, int rank) {
  if (kind == ScheduleKind::kZeroBubbleH1) return zero_bubble_h1(s)[static_cast<size_t>(rank)];
  if (kind == ScheduleKind::kZeroBubbleV) return zero_bubble_v(s)[static_cast<size_t>(rank)];
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

std::vector<Instruction> make_schedule(ScheduleKind kind, const ScheduleShape& s, int rank) {
  validate_schedule(kind, s);
  LOOM_CHECK(rank >= 0 && rank < s.stages, "make_schedule: rank ", rank, " outside [0, ", s.stages,
             ")");
  const int last = s.num_global_stages() - 1;
  std::vector<Instruction> out;
  for (const Unit& u : compute_order(kind, s, rank)) {
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

int message_tag(const ScheduleShape& s, bool grad, int mb, int recv_stage) {
  const int S = s.num_global_stages();
  LOOM_CHECK(2L * s.microbatches * S < 32768L, "pipeline: ", s.microbatches, " micro-batches × ", S,
             " stages exceed the MPI tag space (2·m·S must stay below 32768)");
  return (mb * S + recv_stage) * 2 + (grad ? 1 : 0);
}

}  // namespace loom::parallel::pp
