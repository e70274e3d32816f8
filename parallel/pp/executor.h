// parallel/pp/executor.h — PipelineExecutor: runs a schedule's instruction list
// (parallel/pp/schedule.h) on one pp rank: forward of a chunk on the received activation,
// backward seeded with the received output gradient, transfers issued in the order of Note
// [Communication order] (asynchronous, overlapping compute, safe on NCCL). It knows nothing
// about the model (the chunk forward is a callback), the optimiser or data parallelism, and
// keeps no state between steps beyond its statistics.
//
// Note [Pipeline executor]: per (micro-batch, chunk) the executor keeps the chunk's input (the
// received activation, a leaf with requires_grad so backward leaves its gradient there) and its
// output (the activation sent on, or the last stage's loss) with its autograd graph, from FWD
// until BWD, then drops both (freeing the graph's saved activations).
// The executor walks the rank's IssuePlan (communication_order()): each group of transfers
// is one send_recv_async call, each FWD/BWD runs where the plan places it.
//   RECV_*: into a fresh buffer; the compute op that needs the data waits on it (that wait is
//           the rank's exposed pipeline wait). The plan issues a receive before the compute op
//           during which the data arrives in the schedule's cost model, so it is in flight then.
//   SEND_*: of the output (or of the input's gradient); the Work handle keeps the tensor alive
//           and is waited at the end of the step, so no buffer is reused early.
//   FWD:    output = forward(mb, chunk, input); on the last stage the output is the loss.
//   BWD:    backward(loss) on the last stage, else backward({output}, {received gradient});
//           in a split schedule (zb-h1, zb-v) backward_split, the input's gradient only, keeping
//           the W pass (Note [Split backward] in core/autograd.h) with the graph until
//   BWD_W:  that W pass; before_backward is called before each BWD_W then, not before BWD.
// A hand-off between two stages on this rank (zb-v's turn, Note [Instruction lists] in
// parallel/pp/schedule.h) is no
// transfer: the FWD's input is the previous stage's output, detached into a leaf as a received
// activation would be, and the BWD's seed is that leaf's gradient once the later stage's BWD
// left it there; the later stage's slot ends with that BWD.
// Messages carry message_tag(), which MPI matches; NCCL matches messages between two ranks in
// issue order, which the plan keeps the same on both ends. The last stage's losses are read
// (a device-to-host copy, a synchronisation on a GPU) once, after the step's last compute.
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/pp/schedule.h"
#include "parallel/pp/simulate.h"

namespace loom::parallel::pp {

struct ChunkCallbacks {
  // Forward of local chunk `chunk` for micro-batch mb. `input` is the received activation
  // (undefined on global stage 0). Returns the activation for the next stage, or on the last
  // stage the micro-batch's scalar loss as it is to be backpropagated (already scaled).
  std::function<Tensor(int mb, int chunk, const Tensor& input)> forward;
  // Optional: called before each BWD (in a split schedule before each BWD_W, where the
  // parameters' gradients come); `last` is true for the step's final one on this rank (data
  // parallelism launches its reductions from that backward's hooks).
  std::function<void(bool last)> before_backward;
  // Optional (undefined: 1): a 0-d f64 tensor on the losses' device (dynamic loss scaling,
  // optim::LossScaler::device_scale). The last stage backpropagates loss × loss_scale and sums
  // the losses as forward returned them, so an overflow of the scaled loss stays out of the sum.
  Tensor loss_scale;
};

// Host times: on a GPU they measure issue, not kernels (an NCCL wait does not block the host).
struct PipelineStats {
  double total_s = 0;      // the step's wall time in run()
  double compute_s = 0;    // inside FWD and BWD
  double recv_wait_s = 0;  // blocked on receives (bubble, stage imbalance and transfers)
  double send_wait_s = 0;  // blocked at the end of the step on sends (transfers only)
  // The schedule's own idle fraction on this rank (Note [Pipeline cost model] at the costs the
  // lists were built at, Note [Schedule costs]; transfers free).
  double schedule_bubble = 0;
  // Per local chunk c, at 3c, 3c+1, 3c+2: the step's seconds in its FWDs, BWDs (in a split
  // schedule B) and BWD_Ws, summed over the micro-batches (Note [Schedule costs]).
  std::vector<double> op_s;
  Tensor loss_sum;  // Σ of the last stage's losses, f64 where they are (undefined on other ranks)
  int peak_in_flight = 0;
  double idle_fraction() const { return total_s > 0 ? 1.0 - compute_s / total_s : 0.0; }
  // The idle time the schedule alone would give at this step's compute time: what a receive
  // wait beyond it spent on transfers or on slower stages.
  double schedule_bubble_s() const {
    return schedule_bubble < 1 ? compute_s * schedule_bubble / (1 - schedule_bubble) : 0.0;
  }
};

class PipelineExecutor {
 public:
  // pp: this rank's pp group (rank = pp coordinate); the schedule `kind` of `shape`
  // (validated: ConfigError); activation_shape: the (B, T, C) shape of every activation and
  // gradient crossing a stage boundary, of dtype `dtype`, received on `device` (the model's);
  // costs: the per-stage op costs the lists are built at (make_schedule; empty: unit).
  PipelineExecutor(Communicator& pp, ScheduleKind kind, const ScheduleShape& shape,
                   std::vector<int64_t> activation_shape, DType dtype,
                   Device device = Device::cpu(), const std::vector<OpCosts>& costs = {});

  // Rebuilds the lists (and the issue order and schedule bubble) at `costs`, for the next
  // run(); every rank of the pp group must pass the same costs.
  void set_costs(const std::vector<OpCosts>& costs);

  // Runs one step of the schedule; gradients accumulate into the parameters.
  PipelineStats run(const ChunkCallbacks& callbacks);

  const std::vector<Instruction>& list() const { return list_; }  // this rank's
  const IssuePlan& plan() const { return plan_; }                 // this rank's

 private:
  Communicator& pp_;
  ScheduleKind kind_;
  ScheduleShape shape_;
  std::vector<Instruction> list_;
  IssuePlan plan_;
  double bubble_;  // the schedule's idle fraction on this rank (simulate())
  std::vector<int64_t> act_shape_;
  DType dtype_;
  Device device_;
};

}  // namespace loom::parallel::pp
