// train/planner/pipeline.cpp — the replay of one pipeline step on one pp rank (Note [Pipeline
// memory] in train/planner/pipeline.h).
#include "train/planner/pipeline.h"

#include <map>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"
#include "parallel/pp/simulate.h"

namespace loom::planner {

namespace pp = parallel::pp;
using Id = ByteTimeline::Id;

namespace {

// What the executor holds for one (micro-batch, chunk), as handles on the timeline.
struct Slot {
  Id act_buf = 0, grad_buf = 0;  // receive buffers
  Id input = 0;                  // the received activation, once the FWD has taken it
  Id input_grad = 0;             // its .grad after the BWD
  Id output = 0;                 // a middle stage's output
  StageActivations acts;
};

}  // namespace

void replay_pipeline_step(ByteTimeline& tl, const ReplayShape& s, const PipelineReplay& p,
                          ReplayGrads& grads) {
  const pp::ScheduleShape& shape = p.shape;
  LOOM_CONFIG_CHECK(!pp::splits_backward(p.kind), "parallel.schedule: the memory plan of ",
                    pp::schedule_name(p.kind),
                    " (activations kept from B to W) is not modelled yet; plan 1f1b, whose peak "
                    "of kept activations zb-h1 reaches on its first rank and zb-v on every rank");
  std::vector<std::vector<pp::Instruction>> lists;
  for (int r = 0; r < shape.stages; ++r) lists.push_back(pp::make_schedule(p.kind, shape, r));
  const pp::IssuePlan plan = pp::communication_order(shape, lists).at(static_cast<size_t>(p.rank));
  const std::vector<pp::Instruction>& list = lists.at(static_cast<size_t>(p.rank));
  std::vector<Id> in_transit;  // gradients held by sends that may not have completed
  const int last = shape.num_global_stages() - 1;
  const int64_t act_bytes = s.B * (s.sp ? s.T / s.tp : s.T) * s.C * s.e;  // the stream's rows
  std::map<std::pair<int, int>, Slot> slots;
  std::set<int> chunks_with_grads;
  auto context = [&](const pp::Instruction& ins) {
    tl.set_context("mb " + std::to_string(ins.mb) + ", chunk " + std::to_string(ins.chunk) + ": ");
  };
  for (const pp::IssueStep& step : plan) {
    if (!step.compute) {
      for (int i : step.ops) {
        const pp::Instruction& ins = list.at(static_cast<size_t>(i));
        Slot& slot = slots[{ins.mb, ins.chunk}];
        context(ins);
        tl.set_phase(pp::op_name(ins.op));
        switch (ins.op) {
          case pp::Op::kRecvAct:
            slot.act_buf = tl.alloc(act_bytes);
            break;
          case pp::Op::kRecvGrad:
            slot.grad_buf = tl.alloc(act_bytes);
            break;
          case pp::Op::kSendAct:  // the slot keeps the output until its BWD
            break;
          case pp::Op::kSendGrad:  // the slot goes: its input with it, the gradient with the send
            if (p.late_sends) {
              in_transit.push_back(slot.input_grad);
            } else {
              tl.free(slot.input_grad);
            }
            tl.free(slot.input);
            slots.erase({ins.mb, ins.chunk});
            break;
          default:
            LOOM_FAIL("memory replay: ", pp::to_string(ins), " in a group of transfers");
        }
      }
      continue;
    }
    const pp::Instruction& ins = list.at(static_cast<size_t>(step.ops.front()));
    const int g = shape.global_stage(p.rank, ins.chunk);
    const int64_t blocks =
        p.boundaries.at(static_cast<size_t>(g) + 1) - p.boundaries.at(static_cast<size_t>(g));
    const bool embed = g == 0, head = g == last;
    Slot& slot = slots[{ins.mb, ins.chunk}];
    context(ins);
    if (ins.op == pp::Op::kFwd) {
      Id alias = 0;  // the blocks save the input; the slot owns its bytes
      if (!embed) {
        slot.input = slot.act_buf;
        slot.act_buf = 0;
        alias = tl.alloc(0);
      }
      ReplayShape fs = s;
      fs.units = p.units;
      fs.first_block = p.boundaries.at(static_cast<size_t>(g));
      slot.acts = replay_forward(tl, fs, blocks, embed, head, alias);
      slot.output = slot.acts.output;
      continue;
    }
    ReplayShape bs = s;
    bs.units = p.units;
    bs.first_block = p.boundaries.at(static_cast<size_t>(g));
    bs.keep_weight_grads = p.local_grads && chunks_with_grads.insert(ins.chunk).second;
    const Id grad_alias = head ? 0 : tl.alloc(0);  // the slot owns the received gradient
    const Id gin = replay_backward(tl, bs, slot.acts, grad_alias, grads, embed, head);
    if (!head) {
      tl.free(slot.grad_buf);
      tl.free(slot.output);
    }
    for (Id id : in_transit) tl.free(id);  // sent before this BWD: completed by its end
    in_transit.clear();
    if (embed) {
      slots.erase({ins.mb, ins.chunk});
    } else {
      slot.input_grad = gin;
    }
  }
  tl.set_context("");
  for (Id id : in_transit) tl.free(id);  // the step waits for its sends
  if (p.finish_units) p.finish_units();
  LOOM_CHECK(slots.empty(), "memory replay: ", slots.size(), " pipeline slots left at the end");
  if (p.tied_exchange_elements > 0) {  // mine (cat), theirs, sum
    tl.set_phase("the step's end: tied embedding exchange");
    const int64_t bytes = p.tied_exchange_elements * s.e;
    const Id mine = tl.alloc(bytes), theirs = tl.alloc(bytes), sum = tl.alloc(bytes);
    tl.free(mine);
    tl.free(theirs);
    tl.free(sum);
  }
}

}  // namespace loom::planner
