// parallel/pp/simulate.h — runs every rank's instruction list (parallel/pp/schedule.h) together
// without communicating: simulate() (blocking receives, timed by the cost model below), the
// communication order taken from its timeline, and simulate_in_order(), which runs that order
// under NCCL's rules. Pure functions: no tensors, MPI or model. The executor
// (parallel/pp/executor.h) plans its transfers with communication_order(); the tests check the
// schedules here.
//
// Note [Pipeline cost model]: the simulator gives a chunk's FWD 1 time unit and its BWD 2
// (backward does two GEMMs per forward GEMM) — in a split schedule B 1 and W 1, a micro-batch's
// activations held from its FWD to its W; messages arrive the moment they are sent. The
// makespan T is when the last rank finishes; a rank's busy time is 3·v·m; its bubble is
// T − 3·v·m (idle at the start, middle and end). The formulas the tests check, exactly:
//   GPipe, 1F1B:  T = 3·(m + p − 1), so bubble / T = (p−1)/(m+p−1) on every rank;
//   interleaved:  T = 3·(v·m + p − 1), so bubble / T = (p−1)/(v·m+p−1) (each of the p−1 fill
//                 and drain slots costs one chunk, 1/v of a stage);
//   ZB-H1:        T = 3·m + p − 1 for m ≥ p, so bubble / T = (p−1)/(3m+p−1), a third of
//                 1F1B's bubble; T = 2m + 2p − 1 for m < p.
//   ZB-V:         (v = 2, each chunk F, B, W 1 unit) T = 6m + p − 1 for m = p and m ≥ 2p, so
//                 bubble / T = (p−1)/(6m+p−1): in a stage's time half ZB-H1's idle time, a
//                 third of interleaved v = 2's and a sixth of 1F1B's (Note [ZB-V] in
//                 parallel/pp/schedule.h).
// Peak in-flight activations (micro-batch chunks forwarded but not yet backwarded) on rank r:
//   GPipe m;  1F1B min(m, p−r);  ZB-H1 min(m, p) (FWD to BWD_W);
//   interleaved min(v·m, 2·(p−r−1) + (v−1)·p + 1);  ZB-V 2·min(m, p) chunks (half-stages).
// A hand-off between two stages on one rank (Note [Instruction lists] in
// parallel/pp/schedule.h) takes no time.
// Given StageCosts, the same run prices each global stage's FWD and BWD on its own and adds a
// transfer time to every message (the step-time model's use: train/planner/step_time.h, in
// microseconds); the formulas above are for the default costs.
#pragma once

#include <string>
#include <vector>

#include "parallel/pp/schedule.h"

namespace loom::parallel::pp {

struct SimulationResult {
  bool ok = false;
  std::string error;                // why not ok: deadlock (blocked ranks), order, unmatched
  long makespan = 0;                // time units (Note [Pipeline cost model])
  std::vector<long> busy;           // per rank
  std::vector<int> peak_in_flight;  // per rank
  // Per rank, per instruction of its list: when it happens — a FWD/BWD's start, a SEND's
  // send time (its compute's end), a RECV's message time (when the peer sent it). simulate()
  // only.
  std::vector<std::vector<long>> time;
  // Idle time over makespan, per rank.
  double bubble_fraction(int rank) const;
};

// Durations for simulate() (any integer unit): per global stage its chunk's forward and
// backward, and the time a message takes to arrive after it is sent.
struct StageCosts {
  std::vector<long> fwd, bwd;  // indexed by global stage (num_global_stages() entries)
  long transfer = 0;
  // Split schedules (Note [ZB-H1] in parallel/pp/schedule.h): the W part of each stage's bwd
  // (B is the rest); empty: half of it.
  std::vector<long> wgrad;
};

// Runs lists[r] for every rank r together: sends complete at once (or after costs->transfer),
// each RECV blocks until the matching send has run. Checks that every FWD/BWD of (mb, chunk) runs
// exactly once, each BWD after its FWD; that each RECV receives, in order per (sender, receiver,
// kind), exactly what the peer sent for it, and that no message is left unreceived; and that no
// rank blocks forever (a deadlock names each blocked rank's instruction).
SimulationResult simulate(const ScheduleShape& shape,
                          const std::vector<std::vector<Instruction>>& lists,
                          const StageCosts* costs = nullptr);

// The simulator's costs of a split schedule built at `costs` (Note [Schedule costs] in
// parallel/pp/schedule.h): per global stage fwd F, bwd B + W, wgrad W, no transfer time; empty
// costs give the default run's (1, 2, 1).
StageCosts stage_costs(const ScheduleShape& shape, const std::vector<OpCosts>& costs);

// Note [Communication order]: NCCL runs one communicator's point-to-point operations one
// after another in issue order, and a send completes only once the peer's matching receive
// runs (two ranks' messages match in issue order; tags are not matched). Posting every RECV
// early and every SEND when its data is ready — all MPI needs — deadlocks there: rank 0 waits
// in a receive that rank 1 answers only after a send of its own that rank 0 receives later.
// So each rank issues its transfers in one global order taken from simulate()'s timeline:
// every message gets the time its sender sends it, both ends issue their transfers in
// increasing message time, and the transfers a rank issues at the same time form one group
// (Communicator::send_recv_async: both directions at once). A compute op is issued at its
// start time, after the transfers of that time (so a RECV it needs is issued before it,
// SENDs right after the compute that produced them, and a RECV arriving during a compute is
// issued before that compute: it is in flight meanwhile). This cannot deadlock: by induction
// on time, every group of time t on every rank only waits for groups of earlier times and for
// compute ops that started before t, whose inputs arrived before t. The executor follows the
// order on every backend; simulate_in_order() checks it under NCCL's rules.
struct IssueStep {
  bool compute = false;  // one FWD, BWD or BWD_W, or (false) one group of transfers
  std::vector<int> ops;  // indices into the rank's list, in issue order
};
using IssuePlan = std::vector<IssueStep>;

// Every rank's issue order (Note [Communication order]) for lists that simulate() accepts
// (throws naming simulate()'s error otherwise), from simulate()'s timeline at `costs` (the
// costs the lists were built at; nullptr: the default ones).
std::vector<IssuePlan> communication_order(const ScheduleShape& shape,
                                           const std::vector<std::vector<Instruction>>& lists,
                                           const StageCosts* costs = nullptr);

// Runs every rank's plan under NCCL's rules: per rank, a compute stream (FWD/BWD in plan order,
// each after the receives it needs) and a communication stream (groups in plan order, each
// starting once the previous group completed and every compute op issued before it ran, and
// completing once every peer transfer it holds is in a group the peer has started); the k-th
// send from a to b matches the k-th receive b issues from a. Checks that the plan issues each
// instruction once, a SEND after its compute and a RECV before the compute that needs it, that
// matched messages are the same message (micro-batch, kind, stage), and that no stream blocks
// forever (a deadlock names each rank's blocked group or compute op). Times are not modelled:
// only `ok` and `error` are set.
SimulationResult simulate_in_order(const ScheduleShape& shape,
                                   const std::vector<std::vector<Instruction>>& lists,
                                   const std::vector<IssuePlan>& plans);
}  // namespace loom::parallel::pp
