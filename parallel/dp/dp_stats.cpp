// parallel/dp/dp_stats.cpp — event-log queries, the ZeRO memory formulas, and their printing.
#include "parallel/dp/dp_stats.h"

#include <cstdio>
#include <limits>

namespace loom::parallel {
namespace {

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

const char* dp_event_kind_name(DpEventKind kind) {
  switch (kind) {
    case DpEventKind::kHook:
      return "hook";
    case DpEventKind::kLaunch:
      return "launch";
    case DpEventKind::kLateLaunch:
      return "late_launch";
    case DpEventKind::kReplicaLaunch:
      return "replica_launch";
    case DpEventKind::kFinishBegin:
      return "finish_begin";
    case DpEventKind::kFinishEnd:
      return "finish_end";
    case DpEventKind::kGather:
      return "gather";
    case DpEventKind::kMarker:
      return "marker";
    case DpEventKind::kEarlyLaunch:
      return "early_launch";
    case DpEventKind::kDeferred:
      return "deferred";
    case DpEventKind::kSparseRows:
      return "sparse_rows";
    case DpEventKind::kPrefetch:
      return "prefetch";
    case DpEventKind::kRelease:
      return "release";
    case DpEventKind::kUnitForward:
      return "unit_forward";
    case DpEventKind::kUnitForwardEnd:
      return "unit_forward_end";
    case DpEventKind::kUnitBackward:
      return "unit_backward";
  }
  return "?";
}

uint64_t DpStepStats::first_seq(DpEventKind kind) const {
  for (const DpEvent& e : events) {
    if (e.kind == kind) return e.seq;
  }
  return std::numeric_limits<uint64_t>::max();
}

uint64_t DpStepStats::last_seq(DpEventKind kind) const {
  for (auto it = events.rbegin(); it != events.rend(); ++it) {
    if (it->kind == kind) return it->seq;
  }
  return 0;
}

int DpStepStats::count(DpEventKind kind) const {
  int n = 0;
  for (const DpEvent& e : events) n += e.kind == kind ? 1 : 0;
  return n;
}

DpMemory zero_memory_formula(int64_t psi, size_t elem_bytes, int zero_stage, int shard_count,
                             int optimizer_states) {
  const int64_t e = static_cast<int64_t>(elem_bytes);
  const int64_t n = shard_count;
  DpMemory m;
  m.param_bytes = zero_stage >= 3 ? e * psi / n : e * psi;
  m.grad_bytes = zero_stage >= 2 ? e * psi / n : e * psi;
  m.transient_grad_bytes = zero_stage == 2 ? e * psi : 0;
  const int64_t s = optimizer_states;
  m.optimizer_bytes = zero_stage >= 1 ? s * e * psi / n : s * e * psi;
  return m;
}

std::string format_memory(const DpMemory& measured, const DpMemory& formula) {
  std::string s = "params " + mib(measured.param_bytes) + " (formula " + mib(formula.param_bytes) +
                  "), grads " + mib(measured.grad_bytes) + " (formula " + mib(formula.grad_bytes) +
                  "), optimizer " + mib(measured.optimizer_bytes) + " (formula " +
                  mib(formula.optimizer_bytes) + ")";
  if (measured.transient_grad_bytes > 0) {
    s += ", transient grad buckets " + mib(measured.transient_grad_bytes);
  }
  if (measured.transient_param_bytes > 0) {
    s += ", gathered units " + mib(measured.transient_param_bytes);
  }
  return s;
}

}  // namespace loom::parallel
