// parallel/pp/executor.cpp — PipelineExecutor (see parallel/pp/executor.h and Note [Pipeline
// executor]).
#include "parallel/pp/executor.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "core/autograd.h"

namespace loom::parallel::pp {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool is_compute(Op op) { return op == Op::kFwd || op == Op::kBwd; }

// What the executor holds for one (micro-batch, chunk) between its FWD and BWD.
struct Slot {
  Tensor input;   // received activation (leaf), undefined on stage 0
  Tensor output;  // sent activation, or the loss on the last stage
  WorkPtr act_recv, grad_recv;
  Tensor act_buf, grad_buf;
};

}  // namespace

PipelineExecutor::PipelineExecutor(Communicator& pp, const ScheduleShape& shape,
                                   std::vector<int64_t> activation_shape, DType dtype, Device device)
    : pp_(pp), shape_(shape), act_shape_(std::move(activation_shape)), dtype_(dtype), device_(device) {
  LOOM_CHECK(pp_.size() == shape_.stages, "pipeline: the pp group has ", pp_.size(),
             " ranks but the schedule has ", shape_.stages, " stages");
}

PipelineStats PipelineExecutor::run(const std::vector<Instruction>& list, const ChunkCallbacks& cb) {
  const auto t_start = Clock::now();
  const int rank = pp_.rank(), last_stage = shape_.num_global_stages() - 1;
  PipelineStats st;
  std::map<std::pair<int, int>, Slot> slots;  // (mb, chunk)
  std::vector<WorkPtr> sends;
  std::vector<bool> posted(list.size(), false);
  int in_flight = 0;
  size_t last_bwd = list.size();
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].op == Op::kBwd) last_bwd = i;
  }

  auto post = [&](size_t i) {
    if (posted[i]) return;
    posted[i] = true;
    const Instruction& ins = list[i];
    const bool grad = ins.op == Op::kRecvGrad;
    const int g = shape_.global_stage(rank, ins.chunk);
    Slot& s = slots[{ins.mb, ins.chunk}];
    Tensor buf = Tensor::empty(act_shape_, dtype_, device_);
    WorkPtr w = pp_.recv_async(buf, ins.peer, message_tag(shape_, grad, ins.mb, g));
    (grad ? s.grad_buf : s.act_buf) = buf;
    (grad ? s.grad_recv : s.act_recv) = std::move(w);
  };
  // Posts the receives between compute op i and the next compute op (inclusive of the RECVs
  // that feed it), so they are in flight while op i computes.
  auto post_ahead = [&](size_t i) {
    for (size_t j = i + 1; j < list.size() && !is_compute(list[j].op); ++j) {
      if (list[j].op == Op::kRecvAct || list[j].op == Op::kRecvGrad) post(j);
    }
  };
  auto wait = [&](WorkPtr& w) {
    const auto t0 = Clock::now();
    w->wait();
    w.reset();
    st.wait_s += since(t0);
  };

  for (size_t i = 0; i < list.size(); ++i) {
    const Instruction& ins = list[i];
    const int g = shape_.global_stage(rank, ins.chunk);
    const std::pair<int, int> key{ins.mb, ins.chunk};
    switch (ins.op) {
      case Op::kRecvAct:
      case Op::kRecvGrad: post(i); break;
      case Op::kSendAct: {
        Slot& s = slots.at(key);
        sends.push_back(pp_.send_async(s.output.detach(), ins.peer, message_tag(shape_, false, ins.mb, g + 1)));
        break;
      }
      case Op::kSendGrad: {
        Slot& s = slots.at(key);
        const Tensor gin = s.input.grad();
        LOOM_CHECK(gin.defined(), "pipeline: no gradient reached the input of mb ", ins.mb, " chunk ", ins.chunk);
        sends.push_back(pp_.send_async(gin.contiguous(), ins.peer, message_tag(shape_, true, ins.mb, g - 1)));
        slots.erase(key);  // the send holds the gradient; the graph is gone
        break;
      }
      case Op::kFwd: {
        Slot& s = slots[key];
        if (g > 0) {
          LOOM_CHECK(s.act_recv != nullptr || s.act_buf.defined(), "pipeline: FWD mb ", ins.mb, " chunk ",
                     ins.chunk, " without a RECV_ACT before it");
          if (s.act_recv) wait(s.act_recv);
          s.input = s.act_buf;
          s.act_buf = Tensor();
          s.input.set_requires_grad(true);
        }
        post_ahead(i);
        const auto t0 = Clock::now();
        s.output = cb.forward(ins.mb, ins.chunk, s.input);
        if (g == last_stage) st.loss_sum += s.output.item();
        st.compute_s += since(t0);
        st.peak_in_flight = std::max(st.peak_in_flight, ++in_flight);
        break;
      }
      case Op::kBwd: {
        Slot& s = slots.at(key);
        if (g < last_stage) {
          LOOM_CHECK(s.grad_recv != nullptr, "pipeline: BWD mb ", ins.mb, " chunk ", ins.chunk,
                     " without a RECV_GRAD before it");
          wait(s.grad_recv);
        }
        post_ahead(i);
        if (cb.before_backward) cb.before_backward(i == last_bwd);
        const auto t0 = Clock::now();
        if (g == last_stage) {
          autograd::backward(s.output);
        } else {
          autograd::backward({s.output}, {s.grad_buf});
        }
        st.compute_s += since(t0);
        --in_flight;
        s.output = Tensor();
        s.grad_buf = Tensor();
        if (g == 0) slots.erase(key);  // nothing to send back; otherwise SEND_GRAD erases it
        break;
      }
    }
  }
  for (WorkPtr& w : sends) wait(w);
  st.total_s = since(t_start);
  return st;
}

}  // namespace loom::parallel::pp
