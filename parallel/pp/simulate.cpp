// parallel/pp/simulate.cpp — simulate(), communication_order() and simulate_in_order() (see
// parallel/pp/simulate.h). Pure functions: no communication, no tensors.
#include "parallel/pp/simulate.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace loom::parallel::pp {

double SimulationResult::bubble_fraction(int rank) const {
  if (makespan == 0) return 0;
  return static_cast<double>(makespan - busy.at(static_cast<size_t>(rank))) /
         static_cast<double>(makespan);
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
  std::set<std::pair<int, int>> fwd_done, bwd_done, w_done;
};

class Simulator {
 public:
  Simulator(const ScheduleShape& s, const std::vector<std::vector<Instruction>>& lists,
            const StageCosts* costs)
      : s_(s), lists_(lists), costs_(costs), ranks_(lists.size()) {
    for (const auto& l : lists) {
      for (const Instruction& ins : l) split_ = split_ || ins.op == Op::kBwdW;
    }
    res_.busy.assign(lists.size(), 0);
    res_.peak_in_flight.assign(lists.size(), 0);
    for (const auto& l : lists) res_.time.emplace_back(l.size(), 0L);
  }

  SimulationResult run() {
    if (static_cast<int>(lists_.size()) != s_.stages) return fail("expected one list per stage");
    const size_t stages = static_cast<size_t>(s_.num_global_stages());
    if (costs_ && (costs_->fwd.size() != stages || costs_->bwd.size() != stages ||
                   (!costs_->wgrad.empty() && costs_->wgrad.size() != stages)))
      return fail("expected a forward and a backward cost per global stage");
    bool progress = true;
    while (progress && res_.error.empty()) {
      progress = false;
      for (size_t r = 0; r < lists_.size() && res_.error.empty(); ++r) {
        while (ranks_[r].pc < lists_[r].size() && res_.error.empty() && step(static_cast<int>(r)))
          progress = true;
      }
    }
    if (!res_.error.empty()) return res_;
    std::ostringstream blocked;
    for (size_t r = 0; r < lists_.size(); ++r) {
      if (ranks_[r].pc < lists_[r].size())
        blocked << " rank " << r << " at " << to_string(lists_[r][ranks_[r].pc]) << ";";
    }
    if (!blocked.str().empty()) return fail("deadlock:" + blocked.str());
    const size_t units = static_cast<size_t>(s_.virtual_stages * s_.microbatches);
    for (size_t r = 0; r < lists_.size(); ++r) {
      if (ranks_[r].fwd_done.size() != units || ranks_[r].bwd_done.size() != units ||
          (split_ && ranks_[r].w_done.size() != units)) {
        return fail("rank " + std::to_string(r) +
                    " does not run every (micro-batch, chunk) forward and backward once");
      }
      res_.makespan = std::max(res_.makespan, ranks_[r].clock);
    }
    for (const auto& [key, q] : channels_) {
      if (!q.empty())
        return fail("a message from rank " + std::to_string(std::get<0>(key)) + " to rank " +
                    std::to_string(std::get<1>(key)) + " is never received");
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
    if (ins.mb < 0 || ins.mb >= s_.microbatches || ins.chunk < 0 ||
        ins.chunk >= s_.virtual_stages) {
      fail(where + "micro-batch or chunk out of range");
      return false;
    }
    const int g = s_.global_stage(r, ins.chunk), last = s_.num_global_stages() - 1;
    const std::pair<int, int> key{ins.mb, ins.chunk};
    switch (ins.op) {
      case Op::kFwd: {
        if (st.fwd_done.count(key)) return fail(where + "forward runs twice"), false;
        long start = st.clock;
        if (g > 0 && s_.stage_rank(g - 1) == r) {  // a local hand-off: its FWD ran before
          if (!st.fwd_done.count({ins.mb, s_.stage_chunk(g - 1)}))
            return fail(where + "before the forward of stage " + std::to_string(g - 1) +
                        " on this rank"),
                   false;
        } else if (g > 0) {
          auto it = st.act_arrival.find(key);
          if (it == st.act_arrival.end()) return fail(where + "no RECV_ACT before it"), false;
          start = std::max(start, it->second);
        }
        res_.time[static_cast<size_t>(r)][st.pc] = start;
        const long cost = costs_ ? costs_->fwd[static_cast<size_t>(g)] : 1;
        st.clock = start + cost;
        res_.busy[static_cast<size_t>(r)] += cost;
        st.fwd_done.insert(key);
        res_.peak_in_flight[static_cast<size_t>(r)] =
            std::max(res_.peak_in_flight[static_cast<size_t>(r)], ++st.in_flight);
        break;
      }
      case Op::kBwd: {
        if (!st.fwd_done.count(key)) return fail(where + "backward before its forward"), false;
        if (st.bwd_done.count(key)) return fail(where + "backward runs twice"), false;
        long start = st.clock;
        if (g < last && s_.stage_rank(g + 1) == r) {  // a local hand-off: its BWD ran before
          if (!st.bwd_done.count({ins.mb, s_.stage_chunk(g + 1)}))
            return fail(where + "before the backward of stage " + std::to_string(g + 1) +
                        " on this rank"),
                   false;
        } else if (g < last) {
          auto it = st.grad_arrival.find(key);
          if (it == st.grad_arrival.end()) return fail(where + "no RECV_GRAD before it"), false;
          start = std::max(start, it->second);
        }
        res_.time[static_cast<size_t>(r)][st.pc] = start;
        const long cost = split_ ? bwd_cost(g) - w_cost(g) : bwd_cost(g);
        st.clock = start + cost;
        res_.busy[static_cast<size_t>(r)] += cost;
        st.bwd_done.insert(key);
        if (!split_) --st.in_flight;  // split: the activations stay until W
        break;
      }
      case Op::kBwdW: {
        if (!st.bwd_done.count(key)) return fail(where + "W before its backward"), false;
        if (st.w_done.count(key)) return fail(where + "W runs twice"), false;
        res_.time[static_cast<size_t>(r)][st.pc] = st.clock;
        const long cost = w_cost(g);
        st.clock += cost;
        res_.busy[static_cast<size_t>(r)] += cost;
        st.w_done.insert(key);
        --st.in_flight;
        break;
      }
      case Op::kSendAct:
      case Op::kSendGrad: {
        const bool grad = ins.op == Op::kSendGrad;
        const int to = grad ? g - 1 : g + 1;
        if (to < 0 || to > last) return fail(where + "no stage to send to"), false;
        if (ins.peer != s_.stage_rank(to))
          return fail(where + "wrong peer (stage " + std::to_string(to) + " is on rank " +
                      std::to_string(s_.stage_rank(to)) + ")"),
                 false;
        if (ins.peer == r) return fail(where + "a hand-off on one rank is no message"), false;
        if (!(grad ? st.bwd_done : st.fwd_done).count(key))
          return fail(where + "sends before computing"), false;
        channels_[{r, ins.peer, grad}].push_back(
            {ins.mb, to, st.clock + (costs_ ? costs_->transfer : 0)});
        res_.time[static_cast<size_t>(r)][st.pc] = st.clock;
        break;
      }
      case Op::kRecvAct:
      case Op::kRecvGrad: {
        const bool grad = ins.op == Op::kRecvGrad;
        const int from = grad ? g + 1 : g - 1;
        if (from < 0 || from > last) return fail(where + "no stage to receive from"), false;
        if (ins.peer != s_.stage_rank(from) || ins.peer == r)
          return fail(where + "wrong peer"), false;
        std::deque<Message>& q = channels_[{ins.peer, r, grad}];
        if (q.empty()) return false;  // blocks until the peer sends
        const Message msg = q.front();
        if (msg.mb != ins.mb || msg.recv_stage != g) {
          return fail(where + "out of order: the next message from rank " +
                      std::to_string(ins.peer) + " is for mb " + std::to_string(msg.mb) +
                      " stage " + std::to_string(msg.recv_stage)),
                 false;
        }
        q.pop_front();
        (grad ? st.grad_arrival : st.act_arrival)[key] = msg.time;
        res_.time[static_cast<size_t>(r)][st.pc] = msg.time;
        break;
      }
    }
    ++st.pc;
    return true;
  }

  long bwd_cost(int g) const { return costs_ ? costs_->bwd[static_cast<size_t>(g)] : 2; }
  long w_cost(int g) const {
    if (!costs_) return 1;
    return costs_->wgrad.empty() ? costs_->bwd[static_cast<size_t>(g)] / 2
                                 : costs_->wgrad[static_cast<size_t>(g)];
  }

  const ScheduleShape& s_;
  const std::vector<std::vector<Instruction>>& lists_;
  const StageCosts* costs_;
  bool split_ = false;  // the lists have BWD_W ops: BWD is B
  std::vector<SimRank> ranks_;
  std::map<Channel, std::deque<Message>> channels_;
  SimulationResult res_;
};

}  // namespace

SimulationResult simulate(const ScheduleShape& shape,
                          const std::vector<std::vector<Instruction>>& lists,
                          const StageCosts* costs) {
  return Simulator(shape, lists, costs).run();
}

StageCosts stage_costs(const ScheduleShape& shape, const std::vector<OpCosts>& costs) {
  StageCosts out;
  for (int g = 0; g < shape.num_global_stages(); ++g) {
    const OpCosts c = costs.empty() ? OpCosts{} : costs.at(static_cast<size_t>(g));
    out.fwd.push_back(c.fwd);
    out.bwd.push_back(c.bwd + c.wgrad);
    out.wgrad.push_back(c.wgrad);
  }
  return out;
}

std::vector<IssuePlan> communication_order(const ScheduleShape& shape,
                                           const std::vector<std::vector<Instruction>>& lists,
                                           const StageCosts* costs) {
  const SimulationResult sim = simulate(shape, lists, costs);
  LOOM_CHECK(sim.ok, "pipeline: the schedule does not simulate: ", sim.error);
  std::vector<IssuePlan> plans(lists.size());
  for (size_t r = 0; r < lists.size(); ++r) {
    const std::vector<Instruction>& list = lists[r];
    auto is_compute = [&](size_t i) { return pp::is_compute(list[i].op); };
    std::vector<size_t> order(list.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    // By time; at equal times transfers before compute; then list order.
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::make_pair(sim.time[r][a], is_compute(a)) <
             std::make_pair(sim.time[r][b], is_compute(b));
    });
    IssuePlan& plan = plans[r];
    for (size_t k = 0; k < order.size(); ++k) {
      const size_t i = order[k];
      const bool group_continues =
          !plan.empty() && !plan.back().compute && !is_compute(i) &&
          sim.time[r][static_cast<size_t>(plan.back().ops.front())] == sim.time[r][i];
      if (!group_continues) plan.push_back({is_compute(i), {}});
      plan.back().ops.push_back(static_cast<int>(i));
    }
  }
  return plans;
}

namespace {

// simulate_in_order's state: Note [Communication order] and the declaration in the header.
class InOrderSimulator {
 public:
  InOrderSimulator(const ScheduleShape& s, const std::vector<std::vector<Instruction>>& lists,
                   const std::vector<IssuePlan>& plans)
      : s_(s), lists_(lists), plans_(plans) {}

  SimulationResult run() {
    const size_t p = lists_.size();
    if (static_cast<int>(p) != s_.stages || plans_.size() != p)
      return fail("expected one list and one plan per stage");
    ranks_.resize(p);
    for (size_t r = 0; r < p && res_.error.empty(); ++r) index(static_cast<int>(r));
    if (!res_.error.empty()) return res_;
    if (!match()) return res_;
    bool progress = true;
    while (progress && res_.error.empty()) {
      progress = false;
      for (size_t r = 0; r < p; ++r) {
        while (advance_compute(static_cast<int>(r))) progress = true;
        while (advance_comm(static_cast<int>(r))) progress = true;
      }
    }
    if (!res_.error.empty()) return res_;
    std::ostringstream blocked;
    for (size_t r = 0; r < p; ++r) {
      const Rank& st = ranks_[r];
      if (st.next_compute < st.computes.size()) {
        blocked << " rank " << r << " compute "
                << to_string(lists_[r][op_of(r, st.computes[st.next_compute])]) << ";";
      }
      if (st.next_group < st.groups.size()) {
        blocked << " rank " << r << (st.started ? " in" : " before") << " the group of "
                << to_string(lists_[r][op_of(r, st.groups[st.next_group])]) << ";";
      }
    }
    if (!blocked.str().empty()) return fail("deadlock:" + blocked.str());
    res_.ok = true;
    return res_;
  }

 private:
  struct Rank {
    std::vector<size_t> computes, groups;  // plan step indices, in plan order
    size_t next_compute = 0, next_group = 0;
    bool started = false;         // groups[next_group] is running
    std::vector<int> step_of;     // list index → plan step
    std::vector<bool> step_done;  // per plan step
  };
  SimulationResult fail(const std::string& why) {
    res_.ok = false;
    res_.error = why;
    return res_;
  }
  bool is_compute(Op op) const { return pp::is_compute(op); }
  size_t op_of(size_t r, size_t step) const {
    return static_cast<size_t>(plans_[r][step].ops.front());
  }

  // Checks the plan's shape and where each instruction sits.
  void index(int r) {
    const auto& list = lists_[static_cast<size_t>(r)];
    const auto& plan = plans_[static_cast<size_t>(r)];
    Rank& st = ranks_[static_cast<size_t>(r)];
    st.step_of.assign(list.size(), -1);
    st.step_done.assign(plan.size(), false);
    const std::string who = "rank " + std::to_string(r) + ": ";
    for (size_t k = 0; k < plan.size(); ++k) {
      const IssueStep& step = plan[k];
      if (step.ops.empty() || (step.compute && step.ops.size() != 1))
        return (void)fail(who + "a compute step holds one op, a group at least one");
      for (int i : step.ops) {
        if (i < 0 || static_cast<size_t>(i) >= list.size() ||
            st.step_of[static_cast<size_t>(i)] != -1) {
          return (void)fail(who + "the plan names an instruction twice or out of range");
        }
        if (is_compute(list[static_cast<size_t>(i)].op) != step.compute)
          return (void)fail(who + to_string(list[static_cast<size_t>(i)]) +
                            " in the wrong kind of step");
        st.step_of[static_cast<size_t>(i)] = static_cast<int>(k);
      }
      (step.compute ? st.computes : st.groups).push_back(k);
    }
    for (size_t i = 0; i < list.size(); ++i) {
      if (st.step_of[i] == -1) return (void)fail(who + to_string(list[i]) + " is never issued");
    }
    for (size_t i = 0; i < list.size(); ++i) {  // data dependencies within the rank
      const Instruction& ins = list[i];
      if (is_compute(ins.op)) continue;
      const bool send = ins.op == Op::kSendAct || ins.op == Op::kSendGrad;
      const Op compute = (ins.op == Op::kSendAct || ins.op == Op::kRecvAct) ? Op::kFwd : Op::kBwd;
      const int c = compute_step(r, compute, ins.mb, ins.chunk);
      if (c < 0)
        return (void)fail(who + to_string(ins) + " has no " + op_name(compute) +
                          " of its micro-batch and chunk");
      if (send ? st.step_of[i] < c : st.step_of[i] > c) {
        return (void)fail(who + to_string(ins) +
                          (send ? " is issued before the compute that produces it"
                                : " is issued after the compute that needs it"));
      }
    }
  }

  int compute_step(int r, Op op, int mb, int chunk) const {
    const auto& list = lists_[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].op == op && list[i].mb == mb && list[i].chunk == chunk)
        return ranks_[static_cast<size_t>(r)].step_of[i];
    }
    return -1;
  }

  // Pairs the k-th send a → b with the k-th receive b issues from a, and checks they carry
  // the same message.
  bool match() {
    using Pair = std::pair<int, int>;
    std::map<Pair, std::vector<Pair>> sends,
        recvs;  // (from, to) → (rank, list index) in issue order
    for (size_t r = 0; r < lists_.size(); ++r) {
      for (const IssueStep& step : plans_[r]) {
        for (int i : step.ops) {
          const Instruction& ins = lists_[r][static_cast<size_t>(i)];
          if (ins.op == Op::kSendAct || ins.op == Op::kSendGrad)
            sends[{static_cast<int>(r), ins.peer}].push_back({static_cast<int>(r), i});
          if (ins.op == Op::kRecvAct || ins.op == Op::kRecvGrad)
            recvs[{ins.peer, static_cast<int>(r)}].push_back({static_cast<int>(r), i});
        }
      }
    }
    for (const auto& [pair, ss] : sends) {
      const std::vector<Pair>& rs = recvs[pair];
      const std::string who = "messages from rank " + std::to_string(pair.first) + " to rank " +
                              std::to_string(pair.second) + ": ";
      if (rs.size() != ss.size())
        return fail(who + std::to_string(ss.size()) + " sends but " + std::to_string(rs.size()) +
                    " receives"),
               false;
      for (size_t k = 0; k < ss.size(); ++k) {
        const Instruction& a =
            lists_[static_cast<size_t>(ss[k].first)][static_cast<size_t>(ss[k].second)];
        const Instruction& b =
            lists_[static_cast<size_t>(rs[k].first)][static_cast<size_t>(rs[k].second)];
        const bool grad = a.op == Op::kSendGrad;
        const int to_stage = s_.global_stage(pair.first, a.chunk) + (grad ? -1 : 1);
        const bool same = (b.op == (grad ? Op::kRecvGrad : Op::kRecvAct)) && b.mb == a.mb &&
                          s_.global_stage(pair.second, b.chunk) == to_stage;
        if (!same)
          return fail(who + "message " + std::to_string(k) + " is sent as " + to_string(a) +
                      " but received as " + to_string(b)),
                 false;
        peer_[ss[k]] = rs[k];
        peer_[rs[k]] = ss[k];
      }
    }
    for (const auto& [pair, rs] : recvs) {
      if (!rs.empty() && !sends.count(pair))
        return fail("rank " + std::to_string(pair.second) + " receives from rank " +
                    std::to_string(pair.first) + ", which sends it nothing"),
               false;
    }
    return true;
  }

  // Runs rank r's next compute op if the receives it needs have completed.
  bool advance_compute(int r) {
    Rank& st = ranks_[static_cast<size_t>(r)];
    if (st.next_compute >= st.computes.size()) return false;
    const size_t step = st.computes[st.next_compute];
    const Instruction& ins = lists_[static_cast<size_t>(r)][op_of(static_cast<size_t>(r), step)];
    if (ins.op == Op::kBwdW) {  // needs nothing received (its BWD ran before it)
      st.step_done[step] = true;
      ++st.next_compute;
      return true;
    }
    const Op need = ins.op == Op::kFwd ? Op::kRecvAct : Op::kRecvGrad;
    const auto& list = lists_[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].op == need && list[i].mb == ins.mb && list[i].chunk == ins.chunk &&
          !st.step_done[static_cast<size_t>(st.step_of[i])]) {
        return false;
      }
    }
    st.step_done[step] = true;
    ++st.next_compute;
    return true;
  }

  // Starts rank r's next group (after every compute op issued before it), or completes it once
  // every transfer's peer is in a started group.
  bool advance_comm(int r) {
    Rank& st = ranks_[static_cast<size_t>(r)];
    if (st.next_group >= st.groups.size()) return false;
    const size_t step = st.groups[st.next_group];
    if (!st.started) {
      for (size_t c : st.computes) {
        if (c < step && !st.step_done[c]) return false;
      }
      st.started = true;
      return true;
    }
    for (int i : plans_[static_cast<size_t>(r)][step].ops) {
      const auto [pr, pi] = peer_.at({r, i});
      const Rank& other = ranks_[static_cast<size_t>(pr)];
      const size_t peer_step = static_cast<size_t>(other.step_of[static_cast<size_t>(pi)]);
      const bool peer_running = other.next_group < other.groups.size() &&
                                other.groups[other.next_group] == peer_step && other.started;
      if (!other.step_done[peer_step] && !peer_running) return false;
    }
    st.step_done[step] = true;
    st.started = false;
    ++st.next_group;
    return true;
  }

  const ScheduleShape& s_;
  const std::vector<std::vector<Instruction>>& lists_;
  const std::vector<IssuePlan>& plans_;
  std::vector<Rank> ranks_;
  std::map<std::pair<int, int>, std::pair<int, int>>
      peer_;  // (rank, list index) of each transfer's other end
  SimulationResult res_;
};

}  // namespace

SimulationResult simulate_in_order(const ScheduleShape& shape,
                                   const std::vector<std::vector<Instruction>>& lists,
                                   const std::vector<IssuePlan>& plans) {
  return InOrderSimulator(shape, lists, plans).run();
}

}  // namespace loom::parallel::pp
