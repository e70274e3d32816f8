// parallel/pp/schedule.cpp — the schedule generators and the simulator (see
// parallel/pp/schedule.h). Pure functions: no communication, no tensors.
#include "parallel/pp/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace loom::parallel::pp {

const char* op_name(Op op) {
  switch (op) {
    case Op::kFwd: return "FWD";
    case Op::kBwd: return "BWD";
    case Op::kSendAct: return "SEND_ACT";
    case Op::kRecvAct: return "RECV_ACT";
    case Op::kSendGrad: return "SEND_GRAD";
    case Op::kRecvGrad: return "RECV_GRAD";
  }
  return "?";
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGpipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGpipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  throw ConfigError("parallel.schedule: unknown schedule '" + name + "' (expected gpipe, 1f1b or interleaved)");
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
  LOOM_CONFIG_CHECK(s.microbatches >= 1, "parallel.microbatches: must be >= 1, got ", s.microbatches);
  if (kind != ScheduleKind::kInterleaved) {
    LOOM_CONFIG_CHECK(s.virtual_stages == 1, "parallel.vpp: ", s.virtual_stages, " virtual stages need parallel.schedule: interleaved (",
                      schedule_name(kind), " runs one chunk per rank)");
  } else {
    LOOM_CONFIG_CHECK(s.microbatches % s.stages == 0, "parallel.microbatches: ", s.microbatches,
                      " is not a multiple of parallel.pp ", s.stages, " (the interleaved schedule needs m % pp == 0)");
  }
}

namespace {

struct Unit {
  bool fwd;
  int mb, chunk;
};

// The compute order of `rank` (Note [Instruction lists] in the header).
std::vector<Unit> compute_order(ScheduleKind kind, const ScheduleShape& s, int rank) {
  const int p = s.stages, v = s.virtual_stages, m = s.microbatches, n = v * m;
  auto fwd_unit = [&](int k) {
    if (kind != ScheduleKind::kInterleaved) return Unit{true, k, 0};
    return Unit{true, (k / (p * v)) * p + k % p, (k / p) % v};
  };
  auto bwd_unit = [&](int k) {
    if (kind != ScheduleKind::kInterleaved) return Unit{false, k, 0};
    return Unit{false, (k / (p * v)) * p + k % p, v - 1 - (k / p) % v};
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
  LOOM_CHECK(rank >= 0 && rank < s.stages, "make_schedule: rank ", rank, " outside [0, ", s.stages, ")");
  const int p = s.stages, last = s.num_global_stages() - 1;
  std::vector<Instruction> out;
  for (const Unit& u : compute_order(kind, s, rank)) {
    const int g = s.global_stage(rank, u.chunk);
    const int prev = (g + p - 1) % p, next = (g + 1) % p;  // ranks of stages g−1 and g+1
    if (u.fwd) {
      if (g > 0) out.push_back({Op::kRecvAct, u.mb, u.chunk, prev});
      out.push_back({Op::kFwd, u.mb, u.chunk, -1});
      if (g < last) out.push_back({Op::kSendAct, u.mb, u.chunk, next});
    } else {
      if (g < last) out.push_back({Op::kRecvGrad, u.mb, u.chunk, next});
      out.push_back({Op::kBwd, u.mb, u.chunk, -1});
      if (g > 0) out.push_back({Op::kSendGrad, u.mb, u.chunk, prev});
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

double SimulationResult::bubble_fraction(int rank) const {
  if (makespan == 0) return 0;
  return static_cast<double>(makespan - busy.at(static_cast<size_t>(rank))) / static_cast<double>(makespan);
}

namespace {

struct Message {
  int mb, recv_stage;
  long time;
};

// One rank's progress through its list during simulate().
struct SimRank {
  size_t pc = 0;
  long clock = 0;
  int in_flight = 0;
  std::map<std::pair<int, int>, long> act_arrival, grad_arrival;  // (mb, chunk) → time
  std::set<std::pair<int, int>> fwd_done, bwd_done;
};

class Simulator {
 public:
  Simulator(const ScheduleShape& s, const std::vector<std::vector<Instruction>>& lists)
      : s_(s), lists_(lists), ranks_(lists.size()) {
    res_.busy.assign(lists.size(), 0);
    res_.peak_in_flight.assign(lists.size(), 0);
  }

  SimulationResult run() {
    if (static_cast<int>(lists_.size()) != s_.stages) return fail("expected one list per stage");
    bool progress = true;
    while (progress && res_.error.empty()) {
      progress = false;
      for (size_t r = 0; r < lists_.size() && res_.error.empty(); ++r) {
        while (ranks_[r].pc < lists_[r].size() && res_.error.empty() && step(static_cast<int>(r))) progress = true;
      }
    }
    if (!res_.error.empty()) return res_;
    std::ostringstream blocked;
    for (size_t r = 0; r < lists_.size(); ++r) {
      if (ranks_[r].pc < lists_[r].size()) blocked << " rank " << r << " at " << to_string(lists_[r][ranks_[r].pc]) << ";";
    }
    if (!blocked.str().empty()) return fail("deadlock:" + blocked.str());
    const size_t units = static_cast<size_t>(s_.virtual_stages * s_.microbatches);
    for (size_t r = 0; r < lists_.size(); ++r) {
      if (ranks_[r].fwd_done.size() != units || ranks_[r].bwd_done.size() != units) {
        return fail("rank " + std::to_string(r) + " does not run every (micro-batch, chunk) forward and backward once");
      }
      res_.makespan = std::max(res_.makespan, ranks_[r].clock);
    }
    for (const auto& [key, q] : channels_) {
      if (!q.empty()) return fail("a message from rank " + std::to_string(std::get<0>(key)) + " to rank " + std::to_string(std::get<1>(key)) + " is never received");
    }
    res_.ok = true;
    return res_;
  }

 private:
  using Channel = std::tuple<int, int, bool>;  // sender, receiver, grad

  SimulationResult fail(const std::string& why) {
    res_.ok = false;
    res_.error = why;
    return res_;
  }

  // Runs rank r's next instruction; false when it blocks on a receive.
  bool step(int r) {
    SimRank& st = ranks_[static_cast<size_t>(r)];
    const Instruction& ins = lists_[static_cast<size_t>(r)][st.pc];
    const std::string where = "rank " + std::to_string(r) + " " + to_string(ins) + ": ";
    if (ins.mb < 0 || ins.mb >= s_.microbatches || ins.chunk < 0 || ins.chunk >= s_.virtual_stages) {
      fail(where + "micro-batch or chunk out of range");
      return false;
    }
    const int g = s_.global_stage(r, ins.chunk), last = s_.num_global_stages() - 1;
    const std::pair<int, int> key{ins.mb, ins.chunk};
    switch (ins.op) {
      case Op::kFwd: {
        if (st.fwd_done.count(key)) return fail(where + "forward runs twice"), false;
        long start = st.clock;
        if (g > 0) {
          auto it = st.act_arrival.find(key);
          if (it == st.act_arrival.end()) return fail(where + "no RECV_ACT before it"), false;
          start = std::max(start, it->second);
        }
        st.clock = start + 1;
        res_.busy[static_cast<size_t>(r)] += 1;
        st.fwd_done.insert(key);
        res_.peak_in_flight[static_cast<size_t>(r)] = std::max(res_.peak_in_flight[static_cast<size_t>(r)], ++st.in_flight);
        break;
      }
      case Op::kBwd: {
        if (!st.fwd_done.count(key)) return fail(where + "backward before its forward"), false;
        if (st.bwd_done.count(key)) return fail(where + "backward runs twice"), false;
        long start = st.clock;
        if (g < last) {
          auto it = st.grad_arrival.find(key);
          if (it == st.grad_arrival.end()) return fail(where + "no RECV_GRAD before it"), false;
          start = std::max(start, it->second);
        }
        st.clock = start + 2;
        res_.busy[static_cast<size_t>(r)] += 2;
        st.bwd_done.insert(key);
        --st.in_flight;
        break;
      }
      case Op::kSendAct:
      case Op::kSendGrad: {
        const bool grad = ins.op == Op::kSendGrad;
        const int to = grad ? g - 1 : g + 1;
        if (to < 0 || to > last) return fail(where + "no stage to send to"), false;
        if (ins.peer != to % s_.stages) return fail(where + "wrong peer (stage " + std::to_string(to) + " is on rank " + std::to_string(to % s_.stages) + ")"), false;
        if (!(grad ? st.bwd_done : st.fwd_done).count(key)) return fail(where + "sends before computing"), false;
        channels_[{r, ins.peer, grad}].push_back({ins.mb, to, st.clock});
        break;
      }
      case Op::kRecvAct:
      case Op::kRecvGrad: {
        const bool grad = ins.op == Op::kRecvGrad;
        const int from = grad ? g + 1 : g - 1;
        if (from < 0 || from > last) return fail(where + "no stage to receive from"), false;
        if (ins.peer != from % s_.stages) return fail(where + "wrong peer"), false;
        std::deque<Message>& q = channels_[{ins.peer, r, grad}];
        if (q.empty()) return false;  // blocks until the peer sends
        const Message msg = q.front();
        if (msg.mb != ins.mb || msg.recv_stage != g) {
          return fail(where + "out of order: the next message from rank " + std::to_string(ins.peer) + " is for mb " + std::to_string(msg.mb) + " stage " + std::to_string(msg.recv_stage)), false;
        }
        q.pop_front();
        (grad ? st.grad_arrival : st.act_arrival)[key] = msg.time;
        break;
      }
    }
    ++st.pc;
    return true;
  }

  const ScheduleShape& s_;
  const std::vector<std::vector<Instruction>>& lists_;
  std::vector<SimRank> ranks_;
  std::map<Channel, std::deque<Message>> channels_;
  SimulationResult res_;
};

}  // namespace

SimulationResult simulate(const ScheduleShape& shape, const std::vector<std::vector<Instruction>>& lists) {
  return Simulator(shape, lists).run();
}

}  // namespace loom::parallel::pp
