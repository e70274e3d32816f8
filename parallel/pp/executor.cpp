// parallel/pp/executor.cpp — PipelineExecutor (see parallel/pp/executor.h and Note [Pipeline
// executor]).
#include "parallel/pp/executor.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"

namespace loom::parallel::pp {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// What the executor holds for one (micro-batch, chunk) between its FWD and BWD.
struct Slot {
  Tensor input;   // received activation (leaf), undefined on stage 0
  Tensor output;  // sent activation, or the loss on the last stage
  WorkPtr act_recv, grad_recv;
  Tensor act_buf, grad_buf;
};

// The pp group must match the schedule.
void check_group(const Communicator& pp, const ScheduleShape& shape) {
  LOOM_CHECK(pp.size() == shape.stages, "pipeline: the pp group has ", pp.size(),
             " ranks but the schedule has ", shape.stages, " stages");
}

}  // namespace

PipelineExecutor::PipelineExecutor(Communicator& pp, ScheduleKind kind, const ScheduleShape& shape,
                                   std::vector<int64_t> activation_shape, DType dtype,
                                   Device device, const std::vector<OpCosts>& costs)
    : pp_(pp),
      kind_(kind),
      shape_(shape),
      act_shape_(std::move(activation_shape)),
      dtype_(dtype),
      device_(device) {
  check_group(pp, shape);
  set_costs(costs);
}

void PipelineExecutor::set_costs(const std::vector<OpCosts>& costs) {
  std::vector<std::vector<Instruction>> lists;
  for (int r = 0; r < shape_.stages; ++r) lists.push_back(make_schedule(kind_, shape_, r, costs));
  const StageCosts sim_costs = stage_costs(shape_, costs);
  const size_t rank = static_cast<size_t>(pp_.rank());
  list_ = lists[rank];
  plan_ = communication_order(shape_, lists, &sim_costs).at(rank);
  bubble_ = simulate(shape_, lists, &sim_costs).bubble_fraction(pp_.rank());
}

PipelineStats PipelineExecutor::run(const ChunkCallbacks& cb) {
  const auto t_start = Clock::now();
  const int rank = pp_.rank(), last_stage = shape_.num_global_stages() - 1;
  PipelineStats st;
  std::map<std::pair<int, int>, Slot> slots;  // (mb, chunk)
  std::vector<WorkPtr> sends;
  std::vector<Tensor> losses;  // the last stage's, summed after the last compute op
  int in_flight = 0;
  // Split schedules (Note [Split backward] in core/autograd.h): B leaves each (mb, chunk)'s W
  // pass here until its BWD_W; the parameters' gradients, and data parallelism's hooks, come
  // there, so before_backward is called before each W, not before B.
  bool split = false;
  for (const Instruction& ins : list_) split = split || ins.op == Op::kBwdW;
  std::map<std::pair<int, int>, autograd::DeferredBackward> deferred;
  const Op arming = split ? Op::kBwdW : Op::kBwd;
  size_t last_bwd = list_.size();
  for (size_t i = 0; i < list_.size(); ++i) {
    if (list_[i].op == arming) last_bwd = i;
  }
  st.schedule_bubble = bubble_;
  st.op_s.assign(3 * static_cast<size_t>(shape_.virtual_stages), 0.0);
  auto timed = [&](const Instruction& ins, Clock::time_point t0) {
    const double dt = since(t0);
    st.compute_s += dt;
    const size_t k = ins.op == Op::kFwd ? 0 : ins.op == Op::kBwd ? 1 : 2;
    st.op_s[3 * static_cast<size_t>(ins.chunk) + k] += dt;
  };
  auto wait = [&](WorkPtr& w, double& waited) {
    const auto t0 = Clock::now();
    w->wait();
    w.reset();
    waited += since(t0);
  };

  // One group of transfers: every RECV into a fresh buffer of its slot, every SEND of the
  // slot's output (or input gradient).
  auto issue_group = [&](const std::vector<int>& ops) {
    std::vector<P2P> group;
    for (int i : ops) {
      const Instruction& ins = list_[static_cast<size_t>(i)];
      const int g = shape_.global_stage(rank, ins.chunk);
      const std::pair<int, int> key{ins.mb, ins.chunk};
      switch (ins.op) {
        case Op::kRecvAct:
        case Op::kRecvGrad: {
          const bool grad = ins.op == Op::kRecvGrad;
          Tensor buf = Tensor::empty(act_shape_, dtype_, device_);
          (grad ? slots[key].grad_buf : slots[key].act_buf) = buf;
          group.push_back(P2P::recv(buf, ins.peer, message_tag(shape_, grad, ins.mb, g)));
          break;
        }
        case Op::kSendAct:
          group.push_back(P2P::send(slots.at(key).output.detach(), ins.peer,
                                    message_tag(shape_, false, ins.mb, g + 1)));
          break;
        case Op::kSendGrad: {
          const Tensor gin = slots.at(key).input.grad();
          LOOM_CHECK(gin.defined(), "pipeline: no gradient reached the input of mb ", ins.mb,
                     " chunk ", ins.chunk);
          group.push_back(
              P2P::send(gin.contiguous(), ins.peer, message_tag(shape_, true, ins.mb, g - 1)));
          break;
        }
        default:
          LOOM_FAIL("pipeline: ", to_string(ins), " in a group of transfers");
      }
    }
    std::vector<WorkPtr> works = pp_.send_recv_async(std::move(group));
    for (size_t k = 0; k < ops.size(); ++k) {
      const Instruction& ins = list_[static_cast<size_t>(ops[k])];
      const std::pair<int, int> key{ins.mb, ins.chunk};
      switch (ins.op) {
        case Op::kRecvAct:
          slots[key].act_recv = std::move(works[k]);
          break;
        case Op::kRecvGrad:
          slots[key].grad_recv = std::move(works[k]);
          break;
        case Op::kSendAct:
          sends.push_back(std::move(works[k]));
          break;
        case Op::kSendGrad:
          sends.push_back(std::move(works[k]));
          slots.erase(key);  // the send holds the gradient; the graph is gone
          break;
        default:
          break;
      }
    }
  };

  for (const IssueStep& step : plan_) {
    if (!step.compute) {
      issue_group(step.ops);
      continue;
    }
    const size_t i = static_cast<size_t>(step.ops.front());
    const Instruction& ins = list_[i];
    const int g = shape_.global_stage(rank, ins.chunk);
    const std::pair<int, int> key{ins.mb, ins.chunk};
    if (ins.op == Op::kFwd) {
      Slot& s = slots[key];
      // Stage g−1 on this rank (zb-v's turn): a local hand-off, Note [Instruction lists] in
      // parallel/pp/schedule.h.
      if (g > 0 && shape_.stage_rank(g - 1) == rank) {
        const auto prev = slots.find({ins.mb, shape_.stage_chunk(g - 1)});
        LOOM_CHECK(prev != slots.end() && prev->second.output.defined(), "pipeline: FWD mb ",
                   ins.mb, " chunk ", ins.chunk, " before the forward of stage ", g - 1);
        s.input = prev->second.output.detach();  // a leaf: backward stops here, as at a RECV
        s.input.set_requires_grad(true);
      } else if (g > 0) {
        LOOM_CHECK(s.act_recv != nullptr, "pipeline: FWD mb ", ins.mb, " chunk ", ins.chunk,
                   " without a RECV_ACT before it");
        wait(s.act_recv, st.recv_wait_s);
        s.input = s.act_buf;
        s.act_buf = Tensor();
        s.input.set_requires_grad(true);
      }
      const auto t0 = Clock::now();
      s.output = cb.forward(ins.mb, ins.chunk, s.input);
      if (g == last_stage) losses.push_back(s.output.detach());
      timed(ins, t0);
      st.peak_in_flight = std::max(st.peak_in_flight, ++in_flight);
    } else if (ins.op == Op::kBwdW) {
      auto it = deferred.find(key);
      LOOM_CHECK(it != deferred.end(), "pipeline: BWD_W mb ", ins.mb, " chunk ", ins.chunk,
                 " without its BWD before it");
      if (cb.before_backward) cb.before_backward(i == last_bwd);
      const auto t0 = Clock::now();
      it->second.run();
      deferred.erase(it);
      timed(ins, t0);
      --in_flight;
    } else {
      Slot& s = slots.at(key);
      const bool local_next = g < last_stage && shape_.stage_rank(g + 1) == rank;
      if (local_next) {  // the input gradient of this rank's BWD of stage g+1 seeds this one
        const auto next = slots.find({ins.mb, shape_.stage_chunk(g + 1)});
        LOOM_CHECK(next != slots.end() && next->second.input.grad().defined(), "pipeline: BWD mb ",
                   ins.mb, " chunk ", ins.chunk, " before the backward of stage ", g + 1);
        s.grad_buf = next->second.input.grad().contiguous();
        slots.erase(next);  // nothing is sent: its slot ends here
      } else if (g < last_stage) {
        LOOM_CHECK(s.grad_recv != nullptr, "pipeline: BWD mb ", ins.mb, " chunk ", ins.chunk,
                   " without a RECV_GRAD before it");
        wait(s.grad_recv, st.recv_wait_s);
      }
      if (!split && cb.before_backward) cb.before_backward(i == last_bwd);
      const auto t0 = Clock::now();
      Tensor out = s.output, seed = s.grad_buf;
      if (g == last_stage) {
        out = cb.loss_scale.defined()
                  ? ops::mul(s.output, ops::to_dtype(cb.loss_scale, s.output.dtype()))
                  : s.output;
        seed = Tensor::ones(out.shape(), out.dtype(), out.device());
      }
      if (split) {
        std::vector<Tensor> inputs;
        if (g > 0) inputs.push_back(s.input);
        deferred.emplace(key, autograd::backward_split({out}, {seed}, inputs));
      } else {
        autograd::backward({out}, {seed});
        --in_flight;
      }
      timed(ins, t0);
      s.output = Tensor();
      s.grad_buf = Tensor();
      // Stage 0 sends nothing back, so its slot ends here; a slot whose gradient goes to another
      // rank ends at its SEND_GRAD, one handed over locally at the BWD of stage g−1.
      if (g == 0) slots.erase(key);
    }
  }
  for (const Tensor& l : losses) {  // in order, in f64, where the losses are (nothing is read)
    const Tensor l64 = ops::to_dtype(l, DType::kF64);
    st.loss_sum = st.loss_sum.defined() ? ops::add(st.loss_sum, l64) : l64;
  }
  for (WorkPtr& w : sends) wait(w, st.send_wait_s);
  st.total_s = since(t_start);
  return st;
}

}  // namespace loom::parallel::pp
