// parallel/pp/schedule.h — pipeline schedules as pure functions (stages p, virtual stages per
// rank v, micro-batches m, rank) → the rank's instruction list. Nothing here touches tensors,
// MPI or the model: the executor (parallel/pp/executor.h) runs the lists; parallel/pp/simulate.h
// runs every rank's list together without communicating, which is how the tests check them.
//
// Note [Pipeline stages and chunks]: the model's layers are split into S = p·v consecutive
// stages. Rank r holds v chunks; which global stage its local chunk c is depends on the
// schedule's placement (StagePlacement, a property of the kind: stage_placement()):
//   looping (every schedule but zb-v; Megatron's interleaved layout): stage s = c·p + r, so
//            v = 1 gives s = r and stage s is on rank s mod p;
//   V (zb-v, v = 2): chunk 0 is stage r and chunk 1 is stage 2p−1−r, so rank 0 holds the first
//            and the last stage and rank p−1 the two middle ones (p−1 and p).
// ScheduleShape::global_stage / stage_rank / stage_chunk are the one map; the partition
// (parallel/pp/partition.h) gives layers to global stages in order, and the executor and
// TransformerPipeline ask the shape which rank and chunk a stage is, so no layer moves. The
// activation of micro-batch mb leaves stage s for stage s+1; its gradient goes back from s+1 to
// s. Where both stages are on one rank (V's turn at p−1 → p, or p = 1) the hand-off is local.
//
// Note [Instruction lists]: a list is the rank's compute order (FWD/BWD of (mb, chunk)) with
// its communication inserted around each compute op: RECV_ACT right before a FWD that does not
// start the pipeline, SEND_ACT right after a FWD that does not end it, RECV_GRAD right before a
// BWD that does not end the pipeline, SEND_GRAD right after a BWD that does not start it —
// except where the neighbouring stage is on the same rank (Note [Pipeline stages and chunks]):
// that hand-off is no message (no MPI or NCCL transfer to self); the FWD takes the output of
// the rank's FWD of the stage before (earlier in its list), the BWD the input gradient of its
// BWD of the stage after. Sends are asynchronous (never block); a RECV names the message the
// next compute op needs. The simulator (parallel/pp/simulate.h) checks the strict reading, that
// the list is deadlock-free when every RECV blocks where it stands; the executor issues the
// transfers in the order of Note [Communication order] in parallel/pp/simulate.h, which
// simulate_in_order() checks under NCCL's rules.
//
// Schedules (compute order on rank r, n = v·m units):
//   GPipe:       FWD mb 0..m-1, then BWD mb 0..m-1 (v = 1).
//   1F1B:        w = min(p−r−1, m) warm-up forwards, then m−w times (FWD, BWD), then w BWDs
//                (v = 1). Backwards run in micro-batch order, as in GPipe.
//   Interleaved: Megatron's interleaved 1F1B. Unit k of n in forward order is chunk (k/p) mod v,
//                mb (k/(p·v))·p + k mod p; in backward order the chunk is v−1−(k/p) mod v.
//                w = min(2·(p−r−1) + (v−1)·p, n) warm-up forwards, then n−w times (FWD, BWD),
//                then w BWDs. Needs m % p == 0.
//   ZB-H1:       Qi et al.'s zero-bubble schedule at 1F1B's memory (Note [ZB-H1]): BWD is B
//                (the input's gradient) and a W op (the weights' gradients, Note [Split
//                backward] in core/autograd.h) follows later, filling what 1F1B leaves idle
//                (v = 1).
//   ZB-V:        the same split over 2 chunks per rank in the V placement (Note [ZB-V]):
//                about half ZB-H1's bubble at 1F1B's activation memory (v = 2).
//
// Note [ZB-H1]: the lists come from one greedy run of all ranks together in simulated time, at
// the schedule's costs (Note [Schedule costs]; by default unit costs, F, B and W one unit each:
// B and W share the 2 units of a BWD), each rank taking, whenever it is free
// and in this order: the next F whose activation has arrived, if fewer than p − r micro-batches
// are between their F and their B (1F1B's warm-up) and fewer than p between their F and their W
// (1F1B's peak of kept activations, which its first rank reaches); the next B whose gradient has
// arrived; the oldest W pending; else it waits. So W runs where a rank would otherwise wait or
// where the bound holds an F back: the last rank runs F B pairs and keeps its W's for the drain,
// the first runs F B W (the paper's figure). Makespan at unit costs: 3m + p − 1 for m ≥ p
// (1F1B: 3m + 3(p − 1)), so the bubble is (p − 1)(F + B − W) as in the paper, a third of
// 1F1B's; for m < p, 2m + 2p − 1. Every rank keeps at most min(m, p) micro-batches'
// activations, 1F1B's peak (tests/parallel/pp/pp_schedule_test.cpp).
//
// Note [ZB-V]: Qi et al.'s V-shaped zero-bubble schedule ("Zero Bubble Pipeline Parallelism",
// ICLR 2024, and "Pipeline Parallelism with Controllable Memory"; torchtitan's
// ScheduleZBVZeroBubble): two chunks per rank in the V placement (Note [Pipeline stages and
// chunks]), so every rank holds the same layers' worth of both ends of the pipeline and rank
// p−1's turn from stage p−1 to p is local. As for ZB-H1 the lists come from one greedy run of
// all ranks at the schedule's costs (by default each chunk's F, B and W one unit; a chunk is
// half a stage), each rank taking, whenever it is free and in this order: an F whose
// activation has arrived if fewer than 2p (mb, chunk) units are between their F and their W
// (1F1B's peak of p micro-batches' activations on its first rank, in half-stage chunks) and,
// for chunk 0 when p > 1, fewer than 2p − 1 of chunk 0's (a place stays for chunk 1, whose F
// every chunk-0 unit waits for: at costs where stage 0 runs ahead, chunk 0 could otherwise fill
// the bound and stall every rank; at unit costs it never binds), chunk
// 1's before chunk 0's (the micro-batch nearer its loss first); else a B whose gradient has
// arrived, chunk 0's before chunk 1's (it frees the previous rank); else the oldest W pending;
// else it waits. Within a chunk F's and B's go in micro-batch order. Makespan at unit costs, in
// chunk units: T = 6m + p − 1 for
// m = p and every m ≥ 2p — the least any schedule reaches, since rank p−1 cannot start before
// p−1 forwards have run and then has 6m units of work — so the bubble is (p − 1) chunk
// forwards, (p − 1)·F/2 at a stage's forward F: half ZB-H1's (p − 1)·F and a sixth of 1F1B's
// at F = B = W. (No schedule removes that ramp into the last rank at these costs.) For
// m < p, and just above p, the greedy run is a few units longer, never longer than ZB-H1's
// makespan at the same m (checked for p ≤ 8). Every rank keeps at most 2·min(m, p) chunks'
// activations, 1F1B's peak of min(m, p) micro-batches (tests/parallel/pp/pp_schedule_test.cpp).
//
// Note [Schedule costs]: the greedy runs of Note [ZB-H1] and Note [ZB-V] advance simulated time
// by each op's cost, a chunk's F, B and W per global stage (OpCosts, integers >= 1; unit costs
// by default), from one op's end to the next; the rules (which op a free rank takes, the bounds
// on kept activations) are the same at any costs, so the memory bound and the order of each
// chunk's W passes (micro-batch order: each parameter's gradient sums its micro-batches in the
// single process's order) hold at any costs. At unit costs the lists and formulas are those
// above; at costs with B heavier than W the unit lists leave gaps on the V's critical path that
// lists built at those costs fill (p 4, a chunk's F 2, B 3, W 1: zb-v's simulated bubble 0.054
// at m 16 against the unit lists' 0.331). The greedy rule is not optimal at every cost, so given
// costs, make_schedule also runs it at unit costs and keeps that run's lists where their
// makespan at the costs (simulate()) is shorter (equal stages, p <= 8: only at m < 2p or with
// F > B): lists
// built at costs are never slower in the cost model than the unit lists
// (PipelineSchedule.ZeroBubbleListsFollowCosts). The costs come from parallel.schedule_costs
// (CostSource): unit, given F,B,W ratios for every stage, or measured — the first step's F, B
// and W per chunk from the executor's timing, agreed by one all-reduce of the maximum over
// every rank that runs the lists (TransformerPipeline), then quantised by costs_from_times, so
// every rank builds the same lists for the later steps (host times: on a GPU they time the
// ops' issue, not their kernels, so give ratios there). Lists stay a pure function of (kind,
// shape, costs, rank).
#pragma once

#include <string>
#include <vector>

namespace loom::parallel::pp {

// kBwd is the whole backward, or in a split schedule (one with kBwdW ops) its B pass; kBwdW is
// the W pass of the same (micro-batch, chunk), after its kBwd.
enum class Op { kFwd, kBwd, kSendAct, kRecvAct, kSendGrad, kRecvGrad, kBwdW };
const char* op_name(Op op);  // "FWD", "BWD", "SEND_ACT", …, "BWD_W"
inline bool is_compute(Op op) { return op == Op::kFwd || op == Op::kBwd || op == Op::kBwdW; }

enum class ScheduleKind { kGpipe, k1F1B, kInterleaved, kZeroBubbleH1, kZeroBubbleV };
// "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"; parse_schedule throws ConfigError naming
// parallel.schedule.
const char* schedule_name(ScheduleKind kind);
ScheduleKind parse_schedule(const std::string& name);

// How global stages sit on ranks (Note [Pipeline stages and chunks]).
enum class StagePlacement { kLooping, kV };
inline StagePlacement stage_placement(ScheduleKind kind) {
  return kind == ScheduleKind::kZeroBubbleV ? StagePlacement::kV : StagePlacement::kLooping;
}
// The chunks per rank a kind runs when parallel.vpp is left at 1: 2 for zb-v, else 1.
inline int default_virtual_stages(ScheduleKind kind) {
  return kind == ScheduleKind::kZeroBubbleV ? 2 : 1;
}

struct Instruction {
  Op op = Op::kFwd;
  int mb = 0;     // micro-batch
  int chunk = 0;  // this rank's local chunk the op belongs to (Note [Pipeline stages and chunks])
  int peer = -1;  // pp rank sent to / received from; -1 for FWD/BWD
  bool operator==(const Instruction& o) const = default;
};
std::string to_string(const Instruction& ins);  // "SEND_ACT mb 3 chunk 1 → 2"

struct ScheduleShape {
  int stages = 1;                                       // p, the pp group size
  int virtual_stages = 1;                               // v, chunks per rank
  int microbatches = 1;                                 // m
  StagePlacement placement = StagePlacement::kLooping;  // stage_placement() of the schedule
  int num_global_stages() const { return stages * virtual_stages; }
  // Note [Pipeline stages and chunks]: local chunk → global stage, and back.
  int global_stage(int rank, int chunk) const {
    if (placement == StagePlacement::kV && chunk % 2 == 1) return (chunk + 1) * stages - 1 - rank;
    return chunk * stages + rank;
  }
  int stage_rank(int stage) const {
    const int c = stage / stages, i = stage % stages;
    return placement == StagePlacement::kV && c % 2 == 1 ? stages - 1 - i : i;
  }
  int stage_chunk(int stage) const { return stage / stages; }
};
// The shape of `kind` (its placement set): what every caller outside the tests builds.
inline ScheduleShape schedule_shape(ScheduleKind kind, int stages, int virtual_stages,
                                    int microbatches) {
  return {stages, virtual_stages, microbatches, stage_placement(kind)};
}

// Throws ConfigError naming the key: p, v, m >= 1 ("parallel.pp", "parallel.vpp",
// "parallel.microbatches"); v == 1 for gpipe, 1f1b and zb-h1; v == 2 for zb-v; m % p == 0 for
// interleaved. A shape whose placement is not the kind's is an internal error.
void validate_schedule(ScheduleKind kind, const ScheduleShape& shape);
// Whether the kind splits backward into B and W (kBwdW ops).
inline bool splits_backward(ScheduleKind kind) {
  return kind == ScheduleKind::kZeroBubbleH1 || kind == ScheduleKind::kZeroBubbleV;
}
// One chunk's durations for the zero-bubble greedy runs (Note [Schedule costs]): its forward F,
// its input-gradient pass B and its weight-gradient pass W, in any integer unit, each >= 1.
struct OpCosts {
  long fwd = 1, bwd = 1, wgrad = 1;
  bool operator==(const OpCosts& o) const = default;
};
// Per global stage (num_global_stages() entries) from 3 times per stage (F, B, W of stage g at
// 3g, 3g+1, 3g+2; any unit, not all 0): scaled so the largest is 1000, rounded, at least 1. The
// same times give the same costs on every rank.
std::vector<OpCosts> costs_from_times(const std::vector<double>& fbw);

// parallel.schedule_costs: "unit", "measured", or "F,B,W" (three positive numbers, the ratios of
// a chunk's F, B and W on every stage). parse_schedule_costs throws ConfigError naming the key.
struct CostSource {
  enum class Mode { kUnit, kMeasured, kGiven } mode = Mode::kUnit;
  std::vector<double> given;  // kGiven: F, B, W
  // kGiven: the costs of every stage of `shape`; empty (unit costs) otherwise.
  std::vector<OpCosts> costs(const ScheduleShape& shape) const;
};
CostSource parse_schedule_costs(const std::string& text);
// Throws ConfigError naming parallel.schedule_costs unless the source is unit or `kind` splits
// backward (zb-h1, zb-v).
void validate_schedule_costs(ScheduleKind kind, const CostSource& costs);

// The list of `rank` (0 ≤ rank < p). Pure: the same arguments give the same list. costs: per
// global stage, or empty for unit costs; only zb-h1 and zb-v read them (Note [Schedule costs]).
std::vector<Instruction> make_schedule(ScheduleKind kind, const ScheduleShape& shape, int rank,
                                       const std::vector<OpCosts>& costs = {});

// The message tag of an activation (grad = false) or gradient for micro-batch mb arriving at
// global stage recv_stage; unique within a step, below 32768 (MPI's guaranteed tag bound)
// while 2·m·S < 32768 (checked).
int message_tag(const ScheduleShape& shape, bool grad, int mb, int recv_stage);

}  // namespace loom::parallel::pp
