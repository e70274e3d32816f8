// core/autograd.h — the define-by-run tape: Node, Edge, the backward engine, grad mode.
//
// Every differentiable op that sees an input requiring grad records a Node whose next_edges
// point at the nodes that produced its inputs (or at a leaf's AccumulateGrad). backward() runs
// the reachable nodes in reverse creation order once all their consumers have delivered
// gradients, and accumulates into leaves' .grad.
//
// Note [Gradient-ready hooks]: a leaf's AccumulateGrad runs exactly once per backward, after
// every path to it has delivered its gradient, so hooks fired there see the final gradient of
// this backward. DDP buckets launch their reductions from these hooks, so the engine runs an
// accumulator as soon as it is ready rather than in creation order (a leaf's accumulator is
// created at its first use ever, so creation order would put every hook at the very end).
//
// Note [Partial gradients]: a leaf used k times (a tied embedding: the input lookup and the
// output projection) receives k contributions; AccumulateGrad runs once, after the last, so a
// hook there cannot start reducing the first until backward reaches the last use — for a tied
// embedding, the end of backward. A partial hook (Tensor::register_grad_partial_hook) is offered
// each contribution that arrives while others are still to come, as it arrives; if it takes it
// (data parallelism all-reduces it at once), the engine adds it nowhere, and the leaf's .grad
// and ready hooks see only the contributions nobody took. A contribution not taken is summed as
// before. Contributions to leaves captured by backward_capture are never offered.
//
// Note [Grad mode is thread-local]: NoGradGuard flips a thread_local flag; communication
// threads never record graph. The core's one other piece of implicit state is the tape of the
// selective-recompute region whose fn is running (Note [Selective recompute] in
// core/checkpoint.h), set and restored the same way around exactly those calls.
//
// Note [Split backward]: zero-bubble pipelines (parallel/pp, Qi et al. 2024) run a stage's
// backward in two passes: B, the gradient of the stage's input (what the previous stage waits
// for), and later W, the parameters' gradients (what only the optimizer waits for).
// backward_split(outputs, grads, inputs) runs B: a node runs iff a path leads from it to an
// input ("on the input path"); a node that can compute some of its gradients alone (a
// FunctionNode recorded with a PartialBackward: matmul and the linear ops, whose weight GEMMs are
// half of backward) computes only those toward the input path and keeps the rest for W; every
// other node, and every node only W's gradients reach, waits. The returned DeferredBackward is
// W: run() computes the kept gradients (the partial nodes' remaining edges, then the waiting
// nodes in the usual order), so the parameters' accumulators, and their hooks, run there. B then
// W gives the gradients backward() gives, term for term (each op computes each gradient with
// the same kernels; a node with several consumers sums them in the same order). The nodes and
// their saved tensors live until W. A checkpointed region (core/checkpoint.h) is a partial node
// too: in B it recomputes its forward and splits its own backward the same way (its inputs'
// gradients now, its parameters' in W), keeping the region's fresh graph until W.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace loom::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null when the input does not need a gradient
  int input_nr = 0;            // which output of `node` the input was
};

class Node {
 public:
  explicit Node(std::string name, int num_outputs = 1);
  virtual ~Node() = default;

  // Given the gradients of this node's outputs (undefined where an output got none), returns
  // one gradient per next_edge (undefined allowed where the edge has no node).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  // Drops saved tensors once the node has run (frees activations during backward).
  virtual void release() {}
  // Note [Split backward]: whether apply_some computes only the gradients asked for; otherwise
  // it is apply (every gradient).
  virtual bool computes_partially() const { return false; }
  // The gradients of the next_edges marked in `want` (the others undefined); may be called
  // twice with complementary masks on the same grad_outputs, then release().
  virtual std::vector<Tensor> apply_some(const std::vector<Tensor>& grad_outputs,
                                         const std::vector<bool>& want);
  // Runs before any other ready node (Note [Gradient-ready hooks]): leaves' accumulators.
  virtual bool runs_first() const { return false; }

  const std::string& name() const { return name_; }
  int num_outputs() const { return num_outputs_; }
  uint64_t sequence_nr() const { return sequence_nr_; }

  std::vector<Edge> next_edges;

 private:
  std::string name_;
  int num_outputs_;
  uint64_t sequence_nr_;
};

// A Node whose backward is a function; saved tensors live in the function's captures (capture
// them detached, see save()). This is how ops in core/ops/ record themselves.
class FunctionNode final : public Node {
 public:
  using Backward = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;
  // Computes the gradients of the inputs marked in `want` only (Note [Split backward]).
  using PartialBackward = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs,
                                                            const std::vector<bool>& want)>;
  FunctionNode(std::string name, int num_outputs, Backward fn)
      : Node(std::move(name), num_outputs), fn_(std::move(fn)) {}
  FunctionNode(std::string name, int num_outputs, PartialBackward fn)
      : Node(std::move(name), num_outputs), partial_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  void release() override {
    fn_ = nullptr;
    partial_ = nullptr;
  }
  bool computes_partially() const override { return partial_ != nullptr; }
  std::vector<Tensor> apply_some(const std::vector<Tensor>& grad_outputs,
                                 const std::vector<bool>& want) override;

 private:
  Backward fn_;
  PartialBackward partial_;
};

// Accumulates into a leaf's .grad and fires its hooks (Note [Gradient-ready hooks]).
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf);
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  bool runs_first() const override { return true; }
  // Offers an early contribution to the leaf's partial hooks (Note [Partial gradients]);
  // true when one took it.
  bool offer_partial(const Tensor& contribution);
  std::weak_ptr<TensorImpl> leaf;
};

// ---- grad mode ----
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
// Re-enables recording inside a NoGradGuard (used by activation checkpoint recomputation).
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// The sequence number the next node created on this thread will get (nodes are ordered by it).
uint64_t next_sequence_nr();

// ---- recording (used by op front-ends) ----
// True when grad mode is on and any input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);
// The edge through which a gradient for `t` flows (leaf → its AccumulateGrad).
Edge edge_of(const Tensor& t);
// Records `node` as the producer of `outputs`, wiring its next_edges from `inputs`, and marks
// the outputs as requiring grad. Outputs must be freshly created (no history yet).
void record(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
            const std::vector<Tensor*>& outputs);
// Convenience for the common case: one FunctionNode over `inputs` producing `outputs`.
void record_function(const std::string& name, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor*>& outputs, FunctionNode::Backward fn);
// The same for a backward that can compute a subset of its gradients (Note [Split backward]).
void record_partial_function(const std::string& name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor*>& outputs, FunctionNode::PartialBackward fn);

// ---- running backward ----
// backward(loss): loss must be a scalar; its gradient is 1.
void backward(const Tensor& loss);
// backward(outputs, grads): seeds each output with the given gradient (pipeline stages).
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads);

// Like backward(), but gradients reaching the AccumulateGrad nodes named in `capture` are
// summed into the map instead of the leaves' .grad, and their hooks do not fire. Other leaves
// are accumulated normally. Used by activation checkpointing.
using GradCapture = std::unordered_map<const Node*, Tensor>;
void backward_capture(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads,
                      GradCapture& capture);

// Note [Split backward]: the W pass a backward_split left, movable, run at most once. Destroyed
// without run(), its gradients are dropped.
class DeferredBackward {
 public:
  DeferredBackward();
  ~DeferredBackward();
  DeferredBackward(DeferredBackward&&) noexcept;
  DeferredBackward& operator=(DeferredBackward&&) noexcept;
  DeferredBackward(const DeferredBackward&) = delete;
  DeferredBackward& operator=(const DeferredBackward&) = delete;
  // Computes every gradient B left (the parameters' accumulators and hooks run here).
  void run();
  struct State;  // the paused engine (core/autograd.cpp)

 private:
  explicit DeferredBackward(std::unique_ptr<State> state);
  friend DeferredBackward backward_split(const std::vector<Tensor>&, const std::vector<Tensor>&,
                                         const std::vector<Tensor>&, GradCapture*);
  std::unique_ptr<State> state_;
};

// B: like backward(outputs, grads), but only the gradients on the way to `inputs` (leaves
// requiring grad; none: nothing runs) are computed now; their .grad is set as backward() would.
// The rest is the returned W pass. With `capture` (as backward_capture; it must outlive W) the
// leaves it names are summed into it, in B or in W, instead of into .grad.
DeferredBackward backward_split(const std::vector<Tensor>& outputs,
                                const std::vector<Tensor>& grads, const std::vector<Tensor>& inputs,
                                GradCapture* capture = nullptr);

}  // namespace loom::autograd
