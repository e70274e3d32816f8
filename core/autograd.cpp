// core/autograd.cpp — recording and the backward engine (see core/autograd.h for the model).
#include "core/autograd.h"

#include <queue>
#include <unordered_set>

#include "core/ops/elementwise.h"
#include "core/ops/view.h"

namespace loom::autograd {

namespace {
// Note [Grad mode is thread-local] in core/autograd.h. The sequence counter only orders nodes
// built by one thread; a graph is always recorded by one thread.
thread_local bool t_grad_enabled = true;
thread_local uint64_t t_next_sequence_nr = 0;
}  // namespace

Node::Node(std::string name, int num_outputs)
    : name_(std::move(name)), num_outputs_(num_outputs), sequence_nr_(t_next_sequence_nr++) {}

std::vector<Tensor> Node::apply_some(const std::vector<Tensor>& grad_outputs,
                                     const std::vector<bool>&) {
  return apply(std::vector<Tensor>(grad_outputs));
}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grad_outputs) {
  if (partial_) return apply_some(grad_outputs, std::vector<bool>(next_edges.size(), true));
  LOOM_CHECK(fn_ != nullptr, name(), ": backward run twice (the graph is freed after backward)");
  return fn_(grad_outputs);
}

std::vector<Tensor> FunctionNode::apply_some(const std::vector<Tensor>& grad_outputs,
                                             const std::vector<bool>& want) {
  if (!partial_) return apply(std::vector<Tensor>(grad_outputs));
  return partial_(grad_outputs, want);
}

AccumulateGrad::AccumulateGrad(const std::shared_ptr<TensorImpl>& l)
    : Node("AccumulateGrad", 1), leaf(l) {}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grad_outputs) {
  std::shared_ptr<TensorImpl> impl = leaf.lock();
  Tensor& g = grad_outputs[0];
  if (!impl || !g.defined()) return {};
  Tensor self(impl);
  LOOM_CHECK(g.shape() == self.shape(), "AccumulateGrad: gradient shape ", shape_str(g.shape()),
             " does not match the leaf's ", shape_str(self.shape()));
  if (!impl->grad) {
    // Take the incoming buffer only when nothing else can see it; otherwise copy, so that a
    // later in-place accumulation cannot write into another tensor.
    const bool exclusive = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 &&
                           g.is_contiguous() && g.offset() == 0 && g.dtype() == self.dtype();
    impl->grad =
        exclusive ? g.impl_ptr() : ops::to_dtype(g, self.dtype()).contiguous().clone().impl_ptr();
  } else {
    Tensor acc(impl->grad);
    ops::add_(acc, g);
  }
  for (GradReadyHook& h : impl->hooks) h(self);
  return {};
}

bool AccumulateGrad::offer_partial(const Tensor& contribution) {
  std::shared_ptr<TensorImpl> impl = leaf.lock();
  if (!impl || impl->partial_hooks.empty() || !contribution.defined()) return false;
  Tensor self(impl);
  for (GradPartialHook& h : impl->partial_hooks) {
    if (h(self, contribution)) return true;
  }
  return false;
}

uint64_t next_sequence_nr() { return t_next_sequence_nr; }

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = prev_; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

Edge edge_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  TensorImpl* impl = t.impl();
  if (impl->grad_fn) return {impl->grad_fn, impl->output_nr};
  if (!impl->grad_accumulator)
    impl->grad_accumulator = std::make_shared<AccumulateGrad>(t.impl_ptr());
  return {impl->grad_accumulator, 0};
}

void record(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
            const std::vector<Tensor*>& outputs) {
  node->next_edges.clear();
  for (const Tensor& in : inputs) node->next_edges.push_back(edge_of(in));
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorImpl* impl = outputs[i]->impl();
    LOOM_CHECK(impl->grad_fn == nullptr, node->name(), ": output already has history");
    impl->grad_fn = node;
    impl->output_nr = static_cast<int>(i);
    impl->requires_grad = true;
  }
}

void record_function(const std::string& name, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor*>& outputs, FunctionNode::Backward fn) {
  record(std::make_shared<FunctionNode>(name, static_cast<int>(outputs.size()), std::move(fn)),
         inputs, outputs);
}

void record_partial_function(const std::string& name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor*>& outputs,
                             FunctionNode::PartialBackward fn) {
  record(std::make_shared<FunctionNode>(name, static_cast<int>(outputs.size()), std::move(fn)),
         inputs, outputs);
}

namespace {

// Ready-queue order: accumulators first (their hooks launch communication), then the newest
// node (reverse creation order is a topological order of the tape).
struct ReadyOrder {
  bool operator()(const Node* a, const Node* b) const {
    if (a->runs_first() != b->runs_first()) return b->runs_first();
    return a->sequence_nr() < b->sequence_nr();
  }
};

}  // namespace

// The engine's state: the discovered graph, the edges each node still waits for, the gradients
// delivered so far. One backward() lives in one; backward_split keeps it for W (Note [Split
// backward]).
struct DeferredBackward::State {
  std::unordered_map<Node*, std::shared_ptr<Node>> keep;
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  GradCapture* capture = nullptr;
  // Split mode: the nodes on the input path (B runs them), and what W has left to do.
  bool split = false;
  std::unordered_set<Node*> input_path;
  struct Partial {  // a node that computed B's gradients; W computes the other edges'
    Node* node;
    std::vector<Tensor> grads;
    std::vector<bool> rest;
  };
  std::vector<Partial> partials;
  std::vector<Node*> waiting;  // ready (every edge in) but off the input path: run in W
  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;

  // Discovers the graph from `roots` and counts, for every node, how many edges lead into it.
  void discover(const std::vector<Edge>& roots) {
    std::vector<Node*> stack;
    for (const Edge& r : roots) {
      if (keep.emplace(r.node.get(), r.node).second) stack.push_back(r.node.get());
    }
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges) {
        if (!e.node) continue;
        ++deps[e.node.get()];
        if (keep.emplace(e.node.get(), e.node).second) stack.push_back(e.node.get());
      }
    }
  }

  void deliver(Node* n, int input_nr, const Tensor& g) {
    // Not the last edge into a leaf's accumulator: offer it early (Note [Partial gradients]).
    if (n->runs_first() && deps[n] > 1 && !(capture && capture->count(n))) {
      auto* acc = dynamic_cast<AccumulateGrad*>(n);
      if (acc != nullptr && acc->offer_partial(g)) return;
    }
    std::vector<Tensor>& buf = buffers[n];
    if (buf.empty()) buf.resize(n->num_outputs());
    if (!buf[input_nr].defined()) {
      buf[input_nr] = g;
    } else {
      buf[input_nr] = ops::add(buf[input_nr], g);
    }
  }

  // Delivers out[i] along edge i of n where `which` marks it (all when empty) and counts the
  // edge as done.
  void pass_on(Node* n, const std::vector<Tensor>& out, const std::vector<bool>& which) {
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      if (!which.empty() && !which[i]) continue;
      const Edge& e = n->next_edges[i];
      if (!e.node) continue;
      if (i < out.size() && out[i].defined()) deliver(e.node.get(), e.input_nr, out[i]);
      if (--deps[e.node.get()] == 0) ready.push(e.node.get());
    }
  }

  void run_node(Node* n) {
    std::vector<Tensor> in = std::move(buffers[n]);
    buffers.erase(n);
    if (in.empty()) in.resize(n->num_outputs());
    auto cap = capture ? capture->find(n) : GradCapture::iterator{};
    if (capture && cap != capture->end()) {
      if (in[0].defined())
        cap->second = cap->second.defined() ? ops::add(cap->second, in[0]) : in[0];
      pass_on(n, {}, {});
      return;
    }
    if (split && !input_path.count(n)) {  // W's: keep its gradients until then
      buffers[n] = std::move(in);
      waiting.push_back(n);
      return;
    }
    if (split && n->computes_partially()) {
      std::vector<bool> now(n->next_edges.size()), rest(n->next_edges.size());
      bool any_rest = false;
      for (size_t i = 0; i < n->next_edges.size(); ++i) {
        Node* next = n->next_edges[i].node.get();
        now[i] = next != nullptr && input_path.count(next) > 0;
        rest[i] = next != nullptr && !now[i];
        any_rest = any_rest || rest[i];
      }
      const std::vector<Tensor> out = n->apply_some(in, now);
      pass_on(n, out, now);
      if (any_rest) {
        partials.push_back({n, std::move(in), std::move(rest)});
      } else {
        n->release();
      }
      return;
    }
    const std::vector<Tensor> out = n->apply(std::move(in));
    n->release();
    pass_on(n, out, {});
  }

  void drain() {
    while (!ready.empty()) {
      Node* n = ready.top();
      ready.pop();
      run_node(n);
    }
  }
};

namespace {

void run_backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads,
                  GradCapture* capture) {
  LOOM_CHECK(outputs.size() == grads.size(), "backward: ", outputs.size(), " outputs but ",
             grads.size(), " gradients");
  NoGradGuard no_grad;
  DeferredBackward::State st;
  st.capture = capture;
  std::vector<Edge> roots;
  for (size_t i = 0; i < outputs.size(); ++i) {
    LOOM_CHECK(outputs[i].requires_grad(), "backward: output ", i, " does not require grad");
    LOOM_CHECK(grads[i].defined() && grads[i].shape() == outputs[i].shape(), "backward: gradient ",
               i, " must have the output's shape ", shape_str(outputs[i].shape()));
    roots.push_back(edge_of(outputs[i]));
  }
  st.discover(roots);
  for (size_t i = 0; i < roots.size(); ++i)
    st.deliver(roots[i].node.get(), roots[i].input_nr, grads[i]);
  for (const Edge& r : roots) {
    if (st.deps[r.node.get()] == 0) {
      st.ready.push(r.node.get());
      st.deps[r.node.get()] = -1;  // queued once even if it is several roots
    }
  }
  st.drain();
}

}  // namespace

DeferredBackward::DeferredBackward() = default;
DeferredBackward::DeferredBackward(std::unique_ptr<State> state) : state_(std::move(state)) {}
DeferredBackward::~DeferredBackward() = default;
DeferredBackward::DeferredBackward(DeferredBackward&&) noexcept = default;
DeferredBackward& DeferredBackward::operator=(DeferredBackward&&) noexcept = default;

DeferredBackward backward_split(const std::vector<Tensor>& outputs,
                                const std::vector<Tensor>& grads, const std::vector<Tensor>& inputs,
                                GradCapture* capture) {
  LOOM_CHECK(outputs.size() == grads.size(), "backward_split: ", outputs.size(), " outputs but ",
             grads.size(), " gradients");
  NoGradGuard no_grad;
  auto st = std::make_unique<DeferredBackward::State>();
  st->split = true;
  st->capture = capture;
  std::vector<Edge> roots;
  for (size_t i = 0; i < outputs.size(); ++i) {
    LOOM_CHECK(outputs[i].requires_grad(), "backward_split: output ", i, " does not require grad");
    LOOM_CHECK(grads[i].defined() && grads[i].shape() == outputs[i].shape(),
               "backward_split: gradient ", i, " must have the output's shape ",
               shape_str(outputs[i].shape()));
    roots.push_back(edge_of(outputs[i]));
  }
  st->discover(roots);
  // The input path: the inputs' nodes and every node with an edge to one, found depth first
  // (a node is settled once every node its edges lead to is; accumulators are created after
  // their first consumer, so creation order does not settle it).
  for (const Tensor& in : inputs) {
    LOOM_CHECK(in.defined() && in.requires_grad() && in.is_leaf(), "backward_split: every input ",
               "must be a leaf that requires grad");
    Node* n = edge_of(in).node.get();
    if (st->keep.count(n)) st->input_path.insert(n);
  }
  std::unordered_set<Node*> settled;
  for (auto& [root, keep] : st->keep) {
    if (settled.count(root)) continue;
    std::vector<std::pair<Node*, size_t>> stack = {{root, 0}};  // node, next edge to visit
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      if (next < n->next_edges.size()) {
        Node* e = n->next_edges[next++].node.get();
        if (e != nullptr && !settled.count(e)) stack.push_back({e, 0});
        continue;
      }
      for (const Edge& e : n->next_edges) {
        if (e.node && st->input_path.count(e.node.get())) st->input_path.insert(n);
      }
      settled.insert(n);
      stack.pop_back();
    }
  }
  for (size_t i = 0; i < roots.size(); ++i)
    st->deliver(roots[i].node.get(), roots[i].input_nr, grads[i]);
  for (const Edge& r : roots) {
    if (st->deps[r.node.get()] == 0) {
      st->ready.push(r.node.get());
      st->deps[r.node.get()] = -1;
    }
  }
  st->drain();
  return DeferredBackward(std::move(st));
}

void DeferredBackward::run() {
  if (!state_) return;
  std::unique_ptr<State> st = std::move(state_);
  NoGradGuard no_grad;
  st->split = false;
  for (State::Partial& p : st->partials) {
    const std::vector<Tensor> out = p.node->apply_some(p.grads, p.rest);
    p.node->release();
    p.grads.clear();
    st->pass_on(p.node, out, p.rest);
  }
  st->partials.clear();
  for (Node* n : st->waiting) st->ready.push(n);
  st->waiting.clear();
  st->drain();
}

void backward(const Tensor& loss) {
  LOOM_CHECK(loss.numel() == 1, "backward: loss must have one element, got shape ",
             shape_str(loss.shape()));
  backward({loss}, {Tensor::ones(loss.shape(), loss.dtype(), loss.device())});
}

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads) {
  run_backward(outputs, grads, nullptr);
}

void backward_capture(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads,
                      GradCapture& capture) {
  run_backward(outputs, grads, &capture);
}

}  // namespace loom::autograd
