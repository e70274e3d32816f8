// layers/module.h — Module: the base of every layer, holding named parameters and child modules.
//
// Parameters are leaf tensors with requires_grad, registered in the order a layer creates them;
// children are registered by reference (a module never owns its children through the registry:
// the concrete layer holds them as members). named_parameters() walks parameters then children,
// depth first, in registration order, joining names with dots ("blocks.3.attn.qkv.weight"), so
// the order is stable and identical on every rank. Modules are neither copyable nor movable:
// parents keep pointers to their children. Nothing here computes; layers define forward().
//
// Note [Compute dtype]: mixed precision has one switch, set_compute_dtype(), set on the root
// module (the trainer does it from train.precision) and propagated to every child. Parameters
// keep their own (master) dtype; a layer's forward passes each parameter through compute(),
// an autograd cast (ops::to_dtype, whose backward casts the gradient back), so gradients reach
// the masters in the masters' dtype, and the activations a layer produces are in the compute
// dtype. Lookup tables are read in the master dtype and their output cast (so the sparse
// gradient accumulates in the master dtype). Unset, compute() returns its argument: a model
// computes in its parameters' dtype.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = delete;
  Module& operator=(Module&&) = delete;

  // Registers `t` (made a leaf requiring grad) under `name` and returns the same handle.
  Tensor register_parameter(const std::string& name, Tensor t);
  // Registers a child; `child` must outlive this module (it is normally a member).
  Module& register_module(const std::string& name, Module& child);

  // Every parameter of this module and its children, depth first, in registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  // The parameter with this dotted name; throws naming it when there is none.
  Tensor parameter(const std::string& name) const;
  int64_t num_parameters() const;  // total elements over all parameters
  // This module's own parameters (not its children's), in registration order.
  const std::vector<std::pair<std::string, Tensor>>& own_parameters() const { return params_; }
  // Calls fn on this module and every descendant, depth first, in registration order.
  void for_each_module(const std::function<void(const Module&)>& fn) const;

  // Training mode (dropout on) propagates to every child.
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

  // Clears .grad of every parameter.
  void zero_grad();

  // Note [Compute dtype]. Propagates to every child; std::nullopt: the parameters' own dtype.
  void set_compute_dtype(std::optional<DType> dtype);
  std::optional<DType> compute_dtype() const { return compute_dtype_; }

 protected:
  // `t` cast to the compute dtype (differentiable), or `t` itself when none is set, when it
  // already has that dtype, or when it is undefined (an absent bias).
  Tensor compute(const Tensor& t) const;

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;

  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
  std::optional<DType> compute_dtype_;
};

}  // namespace loom
