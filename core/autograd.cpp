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

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grad_outputs) {
  LOOM_CHECK(fn_ != nullptr, name(), ": backward run twice (the graph is freed after backward)");
  return fn_(grad_outputs);
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

namespace {

// Ready-queue order: accumulators first (their hooks launch communication), then the newest
// node (reverse creation order is a topological order of the tape).
struct ReadyOrder {
  bool operator()(const Node* a, const Node* b) const {
    if (a->runs_first() != b->runs_first()) return b->runs_first();
    return a->sequence_nr() < b->sequence_nr();
  }
};

void run_backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads,
                  GradCapture* capture) {
  LOOM_CHECK(outputs.size() == grads.size(), "backward: ", outputs.size(), " outputs but ",
             grads.size(), " gradients");
  NoGradGuard no_grad;

  // Discover the graph and count, for every node, how many edges lead into it.
  std::unordered_map<Node*, std::shared_ptr<Node>> keep;
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack;
  std::vector<Edge> roots;
  for (size_t i = 0; i < outputs.size(); ++i) {
    LOOM_CHECK(outputs[i].requires_grad(), "backward: output ", i, " does not require grad");
    LOOM_CHECK(grads[i].defined() && grads[i].shape() == outputs[i].shape(), "backward: gradient ",
               i, " must have the output's shape ", shape_str(outputs[i].shape()));
    roots.push_back(edge_of(outputs[i]));
    Node* n = roots.back().node.get();
    if (keep.emplace(n, roots.back().node).second) stack.push_back(n);
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

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  auto deliver = [&](Node* n, int input_nr, const Tensor& g) {
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
  };
  for (size_t i = 0; i < roots.size(); ++i)
    deliver(roots[i].node.get(), roots[i].input_nr, grads[i]);

  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;
  for (const Edge& r : roots) {
    if (deps[r.node.get()] == 0) {
      ready.push(r.node.get());
      deps[r.node.get()] = -1;  // queued once even if it is several roots
    }
  }
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> in = std::move(buffers[n]);
    buffers.erase(n);
    if (in.empty()) in.resize(n->num_outputs());
    std::vector<Tensor> out;
    auto cap = capture ? capture->find(n) : GradCapture::iterator{};
    if (capture && cap != capture->end()) {
      if (in[0].defined())
        cap->second = cap->second.defined() ? ops::add(cap->second, in[0]) : in[0];
    } else {
      out = n->apply(std::move(in));
      n->release();
    }
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.node) continue;
      if (i < out.size() && out[i].defined()) deliver(e.node.get(), e.input_nr, out[i]);
      if (--deps[e.node.get()] == 0) ready.push(e.node.get());
    }
  }
}

}  // namespace

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
