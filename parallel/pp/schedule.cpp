// parallel/pp/schedule.cpp — the schedule generators (see parallel/pp/schedule.h). Pure
// functions: no communication, no tensors.
#include "parallel/pp/schedule.h"

#include <algorithm>
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
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGpipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  throw ConfigError("parallel.schedule: unknown schedule '" + name +
                    "' (expected gpipe, 1f1b or interleaved)");
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
  if (kind != ScheduleKind::kInterleaved) {
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
  LOOM_CHECK(rank >= 0 && rank < s.stages, "make_schedule: rank ", rank, " outside [0, ", s.stages,
             ")");
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

}  // namespace loom::parallel::pp
