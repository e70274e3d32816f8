// train/planner/pipeline.h — one pipeline step's memory on one pp rank, replayed on the byte
// counter (Note [Memory timeline] in train/planner/memory.h) in the order the executor runs it.
//
// Note [Pipeline memory]: the replay walks the rank's issue plan (parallel/pp/simulate.h
// communication_order of parallel/pp/schedule.h make_schedule) as PipelineExecutor::run
// (parallel/pp/executor.cpp) does, holding what its slots and sends hold:
//   RECV_ACT   a fresh (B, T, C) buffer, from the group that issues it; it becomes the chunk's
//              input at the FWD and lives until SEND_GRAD drops the slot;
//   RECV_GRAD  a fresh (B, T, C) buffer, until its BWD has run;
//   FWD        the chunk's forward (embeddings on global stage 0, head and loss on the last),
//              its saved activations held until the BWD; the output a middle stage sends on;
//   SEND_ACT   the output, which the slot keeps until the BWD anyway;
//   BWD        the chunk's backward seeded with the received gradient; the input's gradient
//              stays as the input leaf's .grad;
//   SEND_GRAD  that gradient, held by the send until the transfer completes (the MPI
//              communicator drops a send's tensor when it completes; the step waits for all).
// When a send completes depends on when the peer posts its receive, which is timing (the MPI
// backend runs a communicator's groups one after another, Note [Communication order] in
// parallel/pp/simulate.h): the
// replay gives two bounds. `late_sends` false: every send completes as it is issued (the cost
// model's reading, in which the peer's receive is already posted); true: a sent gradient is held
// until the sender's next BWD has run — the bound the measurements bear out (a rank with sends
// holds one more gradient during its next BWD; tests/train/plan_memory_mpi_test.cpp checks the
// measured peak against the range). The plan reports the upper bound.
// Weight gradients: without data parallelism (LocalEngine) each chunk's first backward of the
// step creates its parameters' .grad; with it, gradients land in the buckets.
// Tied embeddings across stages: after the step, the first and last rank exchange the table's
// gradient through three temporaries of its size (TransformerPipeline::sync_tied_gradients).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "parallel/pp/schedule.h"
#include "train/planner/replay.h"

namespace loom::planner {

struct PipelineReplay {
  parallel::pp::ScheduleKind kind = parallel::pp::ScheduleKind::k1F1B;
  parallel::pp::ScheduleShape shape;
  int rank = 0;                        // the pp coordinate
  std::vector<int64_t> boundaries;     // global stage g holds blocks [b[g], b[g+1])
  bool local_grads = true;             // weight gradients become .grad (no data parallelism)
  int64_t tied_exchange_elements = 0;  // the tied table's elements on the first/last rank, or 0
  bool late_sends = true;              // sent gradients held until the next BWD (above)
  // ZeRO-3 over the stage's units (the model's unit numbers mapped to them; the caller's), and
  // what the gatherer does at the step's end.
  UnitEvents* units = nullptr;
  std::function<void()> finish_units;
};

// Replays the step on `tl`; .grad tensors created go to grads.kept (the caller frees them).
void replay_pipeline_step(ByteTimeline& tl, const ReplayShape& s, const PipelineReplay& p,
                          ReplayGrads& grads);

}  // namespace loom::planner
