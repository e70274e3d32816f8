// optim/optimizer.h — the optimiser interface: a list of named parameters (ParamRef) and a step
// that updates them in place from their .grad, plus the hooks a checkpoint needs to save and
// restore the optimiser's state. Holds no schedule (the caller passes lr to each step) and no
// clipping (optim/clip.h); concrete optimisers are optim/adamw.h and optim/sgd.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom::optim {

// One parameter as an optimiser sees it: its checkpoint name (e.g. "h.0.attn.c_attn.weight"),
// the leaf tensor updated in place, and whether weight decay applies to it (see
// optim/decay_rule.h for the default choice).
struct ParamRef {
  std::string name;
  Tensor param;
  bool decay = true;
};

// Note [Optimizer state contract]: state_tensors() returns every piece of tensor state the
// optimiser keeps, as (name, tensor) pairs, in a fixed order. The tensors are the *live* buffers
// (handles sharing storage with the optimiser), allocated in the constructor with their final
// shape, dtype and device, so:
//   * saving: read their values (e.g. copy to host) after any step;
//   * loading: construct the optimiser with the same parameters, then copy the saved values
//     *into* the returned tensors in place (ops::copy_), and call set_step_count() with the saved
//     step_count(). Replacing the handles does nothing; resizing them is not allowed.
// Names are "<state kind>.<parameter name>", e.g. "exp_avg.h.0.mlp.c_fc.weight". Under ZeRO a
// rank's optimiser is built over its shard of each parameter, so the same names describe shards.
class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamRef> params);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient, with learning rate lr, and advances
  // step_count(). Parameters whose .grad is undefined are left unchanged (their state too).
  virtual void step(double lr) = 0;
  // step(lr) with every gradient multiplied by grad_scale first: a 0-d f64 tensor on the
  // parameters' device (undefined: plain step(lr)). How a device step clips and unscales without
  // reading the norm back (Note [Device step] in train/train_step.cpp). A factor that is not finite
  // (kernels/reduce.h loss_scale_step after an f16 overflow) skips the step: nothing changes and
  // step_count() does not advance. This default reads the factor and scales .grad in place (one
  // host read); AdamW applies it inside its multi-tensor update where the factor lies, its step
  // count held on the device too. Either way .grad's contents afterwards are unspecified.
  virtual void step_scaled(double lr, const Tensor& grad_scale);
  // Clears the .grad of every parameter (the next backward starts from nothing).
  virtual void zero_grad();

  // See Note [Optimizer state contract].
  virtual std::vector<std::pair<std::string, Tensor>> state_tensors() { return {}; }
  // Number of updates made (AdamW's bias correction uses it); skipped steps do not count. AdamW
  // keeps it on the parameters' device, so reading it waits for the device's queued work.
  virtual int64_t step_count() const { return step_count_; }
  virtual void set_step_count(int64_t step);

  const std::vector<ParamRef>& params() const { return params_; }

 protected:
  std::vector<ParamRef> params_;
  int64_t step_count_ = 0;
};

// Makes an optimizer over the given parameters: how a wrapper (the sharded data-parallel
// optimizer) builds its inner optimizer without knowing which one it is.
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<ParamRef>)>;

}  // namespace loom::optim
