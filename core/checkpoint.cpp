// core/checkpoint.cpp — full and selective recompute (Notes [Activation checkpoint] and
// [Selective recompute] in core/checkpoint.h).
#include "core/checkpoint.h"

#include <sstream>
#include <unordered_set>

#include "core/autograd.h"
#include "core/error.h"

namespace loom {
namespace {

// What a selective region's kept ops produced, in call order (Note [Selective recompute]).
struct KeptTape {
  struct Entry {
    KeptOp kind;
    std::vector<Tensor> results;  // detached; they share the results' storage
  };
  KeptOps keep = 0;
  bool replaying = false;
  size_t next = 0;
  std::vector<Entry> entries;
};

// The tape of the region whose fn this thread is running; null outside one and in full ones.
thread_local KeptTape* t_tape = nullptr;

// Sets this thread's tape for one call of a region's fn (exception-safe).
class TapeScope {
 public:
  explicit TapeScope(KeptTape* tape) : prev_(t_tape) { t_tape = tape; }
  ~TapeScope() { t_tape = prev_; }
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;

 private:
  KeptTape* prev_;
};

const char* kept_op_name(KeptOp k) { return k == KeptOp::kMatmul ? "matmul" : "attention"; }

using autograd::AccumulateGrad;
using autograd::Edge;
using autograd::Node;

// Fresh leaves over the inputs' data; those whose input needs a gradient require grad.
std::vector<Tensor> detached_inputs(const std::vector<Tensor>& inputs,
                                    const std::vector<bool>& needs) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor d = inputs[i].detach();
    if (needs[i]) d.set_requires_grad(true);
    out.push_back(d);
  }
  return out;
}

// The AccumulateGrad nodes reachable from `outputs` that are not the region's own inputs.
// A non-leaf node older than the region means fn used a tensor with history it was not given.
std::vector<std::shared_ptr<Node>> region_parameters(const std::vector<Tensor>& outputs,
                                                     const std::vector<Tensor>& region_inputs,
                                                     uint64_t region_start) {
  std::unordered_set<const Node*> own;
  for (const Tensor& t : region_inputs) {
    if (t.requires_grad()) own.insert(autograd::edge_of(t).node.get());
  }
  std::vector<std::shared_ptr<Node>> params;
  std::unordered_set<const Node*> seen;
  std::vector<std::shared_ptr<Node>> stack;
  for (const Tensor& o : outputs) {
    if (o.grad_fn()) stack.push_back(o.grad_fn());
  }
  while (!stack.empty()) {
    std::shared_ptr<Node> n = stack.back();
    stack.pop_back();
    if (!seen.insert(n.get()).second) continue;
    if (dynamic_cast<AccumulateGrad*>(n.get())) {
      if (!own.count(n.get())) params.push_back(n);
      continue;
    }
    LOOM_CHECK(n->sequence_nr() >= region_start,
               "checkpoint: the region used a tensor produced by ", n->name(),
               " outside it; pass such tensors in `inputs`");
    for (const Edge& e : n->next_edges) {
      if (e.node) stack.push_back(e.node);
    }
  }
  return params;
}

class CheckpointNode final : public Node {
 public:
  CheckpointNode(CheckpointFn fn, std::vector<Tensor> saved_inputs, std::vector<bool> needs,
                 std::vector<std::shared_ptr<Node>> params, std::vector<Generator*> gens,
                 std::vector<GeneratorState> gen_states, std::shared_ptr<KeptTape> tape,
                 int num_outputs)
      : Node("checkpoint", num_outputs),
        fn_(std::move(fn)),
        inputs_(std::move(saved_inputs)),
        needs_(std::move(needs)),
        params_(std::move(params)),
        gens_(std::move(gens)),
        gen_states_(std::move(gen_states)),
        tape_(std::move(tape)) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    return apply_some(grad_outputs, std::vector<bool>(next_edges.size(), true));
  }

  // Note [Split backward] in core/autograd.h: the first call recomputes the region; asked for
  // its inputs' gradients alone (B), it splits the region's backward and keeps the W part,
  // which the second call (its parameters') runs.
  bool computes_partially() const override { return true; }
  std::vector<Tensor> apply_some(const std::vector<Tensor>& grad_outputs,
                                 const std::vector<bool>& want) override {
    const size_t n_in = inputs_.size();
    bool any_param = false, all = true;
    for (size_t i = 0; i < want.size(); ++i) {
      all = all && want[i];
      if (i >= n_in) any_param = any_param || want[i];
    }
    if (!recomputed_) {
      recomputed_ = true;
      recompute(grad_outputs, all || any_param);
    } else if (any_param) {
      deferred_.run();  // W: the parameters' gradients, into capture_
    }
    std::vector<Tensor> result;
    for (size_t i = 0; i < n_in; ++i) {
      const Tensor& t = region_inputs_[i];
      result.push_back(want[i] && t.requires_grad() ? capture_[autograd::edge_of(t).node.get()]
                                                    : Tensor());
    }
    for (size_t i = 0; i < params_.size(); ++i)
      result.push_back(want[n_in + i] ? capture_[params_[i].get()] : Tensor());
    return result;
  }

  void release() override {
    inputs_.clear();
    region_inputs_.clear();
    fn_ = nullptr;
    tape_.reset();
    deferred_ = autograd::DeferredBackward();
    capture_.clear();
  }

 private:
  CheckpointFn fn_;
  std::vector<Tensor> inputs_;  // detached; the only activations the region keeps
  std::vector<bool> needs_;     // which inputs need a gradient
  std::vector<std::shared_ptr<Node>> params_;
  std::vector<Generator*> gens_;
  std::vector<GeneratorState> gen_states_;
  std::shared_ptr<KeptTape> tape_;  // selective regions only (Note [Selective recompute])
  bool recomputed_ = false;
  std::vector<Tensor> region_inputs_;  // the recomputation's leaves
  autograd::GradCapture capture_;      // the region's inputs' and parameters' gradients
  autograd::DeferredBackward deferred_;

  // Runs fn again with the random generators of its forward, then its backward with the
  // region's inputs' and parameters' gradients captured: all of it, or (split, no parameter
  // asked for yet) only the inputs' part, the rest kept in deferred_.
  void recompute(const std::vector<Tensor>& grad_outputs, bool whole) {
    std::vector<GeneratorState> now;
    for (size_t i = 0; i < gens_.size(); ++i) {
      now.push_back(gens_[i]->state());
      gens_[i]->set_state(gen_states_[i]);
    }
    region_inputs_ = detached_inputs(inputs_, needs_);
    std::vector<Tensor> outputs;
    {
      autograd::EnableGradGuard enable;
      if (tape_) {
        tape_->replaying = true;
        tape_->next = 0;
      }
      TapeScope scope(tape_.get());
      outputs = fn_(region_inputs_);
    }
    for (size_t i = 0; i < gens_.size(); ++i) gens_[i]->set_state(now[i]);
    if (tape_) {
      LOOM_CHECK(tape_->next == tape_->entries.size(), "checkpoint: the recomputation used ",
                 tape_->next, " of the ", tape_->entries.size(),
                 " kept results of the region's forward (fn must be deterministic)");
      tape_.reset();  // the fresh graph holds what its backward needs
    }
    std::vector<Tensor> split_inputs;
    for (const Tensor& t : region_inputs_) {
      if (!t.requires_grad()) continue;
      capture_[autograd::edge_of(t).node.get()] = Tensor();
      split_inputs.push_back(t);
    }
    for (const auto& p : params_) capture_[p.get()] = Tensor();
    std::vector<Tensor> roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (grad_outputs[i].defined() && outputs[i].requires_grad()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (roots.empty()) return;
    if (whole) {
      autograd::backward_capture(roots, grads, capture_);
    } else {
      deferred_ = autograd::backward_split(roots, grads, split_inputs, &capture_);
    }
  }
};

}  // namespace

KeptOps parse_kept_ops(const std::string& text, const std::string& key) {
  KeptOps keep = 0;
  std::stringstream in(text);
  std::string word;
  while (std::getline(in, word, ',')) {
    const size_t a = word.find_first_not_of(' '), b = word.find_last_not_of(' ');
    word = a == std::string::npos ? "" : word.substr(a, b - a + 1);
    KeptOp k;
    if (word == "matmul")
      k = KeptOp::kMatmul;
    else if (word == "attention")
      k = KeptOp::kAttention;
    else
      throw ConfigError(key + ": unknown op '" + word + "' in '" + text +
                        "' (a comma-separated list of matmul, attention)");
    if (keep & kept_bit(k))
      throw ConfigError(key + ": '" + word + "' is listed twice in '" + text + "'");
    keep |= kept_bit(k);
  }
  if (keep == 0)
    throw ConfigError(key + ": names no op (a comma-separated list of matmul, attention)");
  return keep;
}

std::string kept_ops_text(KeptOps keep) {
  std::string out;
  for (KeptOp k : {KeptOp::kMatmul, KeptOp::kAttention}) {
    if (!(keep & kept_bit(k))) continue;
    if (!out.empty()) out += ",";
    out += kept_op_name(k);
  }
  return out;
}

std::vector<Tensor> kept_or_computed(KeptOp kind,
                                     const std::function<std::vector<Tensor>()>& compute) {
  KeptTape* tape = t_tape;
  // With grad mode off an op is a piece of another op's forward (a tensor-parallel layer's
  // GEMM, whose result its collective then reduces in place): that op is kept, if any.
  if (!tape || !(tape->keep & kept_bit(kind)) || !autograd::grad_enabled()) return compute();
  if (!tape->replaying) {
    std::vector<Tensor> results = compute();
    KeptTape::Entry e{kind, {}};
    for (const Tensor& t : results) e.results.push_back(t.defined() ? t.detach() : Tensor());
    tape->entries.push_back(std::move(e));
    return results;
  }
  LOOM_CHECK(tape->next < tape->entries.size(), "checkpoint: the recomputation called more ",
             kept_op_name(kind), " ops than the region's forward (fn must be deterministic)");
  const KeptTape::Entry& e = tape->entries[tape->next++];
  LOOM_CHECK(e.kind == kind, "checkpoint: the recomputation called ", kept_op_name(kind),
             " where the region's forward called ", kept_op_name(e.kind));
  std::vector<Tensor> results;
  for (const Tensor& t : e.results) results.push_back(t.defined() ? t.detach() : Tensor());
  return results;
}

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               const std::vector<Generator*>& generators, KeptOps keep) {
  if (!autograd::grad_enabled()) {
    TapeScope scope(nullptr);  // not a region: an enclosing one's tape is not this fn's
    return fn(inputs);
  }
  std::vector<GeneratorState> states;
  for (Generator* g : generators) states.push_back(g->state());
  std::vector<bool> needs;
  for (const Tensor& t : inputs) needs.push_back(t.requires_grad());
  std::vector<Tensor> region_inputs = detached_inputs(inputs, needs);
  const uint64_t region_start = autograd::next_sequence_nr();
  auto tape = keep ? std::make_shared<KeptTape>() : nullptr;
  if (tape) tape->keep = keep;
  std::vector<Tensor> graph_outputs;
  {
    TapeScope scope(tape.get());
    graph_outputs = fn(region_inputs);
  }
  std::vector<std::shared_ptr<Node>> params =
      region_parameters(graph_outputs, region_inputs, region_start);

  std::vector<Tensor> outputs;
  bool any = false;
  for (const Tensor& o : graph_outputs) {
    outputs.push_back(o.detach());
    any = any || o.requires_grad();
  }
  graph_outputs.clear();  // frees the region's activations
  if (!any) return outputs;

  std::vector<Tensor> saved;
  for (const Tensor& t : inputs) saved.push_back(t.detach());
  auto node =
      std::make_shared<CheckpointNode>(fn, std::move(saved), std::move(needs), params, generators,
                                       states, std::move(tape), static_cast<int>(outputs.size()));
  std::vector<Tensor*> out_ptrs;
  for (Tensor& o : outputs) out_ptrs.push_back(&o);
  // Edges: the region's inputs first, then its parameters' accumulators.
  autograd::record(node, inputs, out_ptrs);
  for (const auto& p : params) node->next_edges.push_back({p, 0});
  return outputs;
}

}  // namespace loom
