// layers/unit_hooks.h — UnitHooks: how a model tells a parameter-sharding engine (ZeRO-3 in
// parallel/dp) when each of its parameter units is used. A unit is a group of parameters used
// together (a Transformer's embeddings, each block, the final norm with the head). Interface
// only: nothing here communicates, allocates or knows about data parallelism.
#pragma once

#include "core/tensor.h"

namespace loom {

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // Called just before unit `unit`'s forward reads its parameters.
  virtual void before_forward(int unit) = 0;
  // Called once the unit's forward has produced `out`; returns the tensor the model continues
  // with (the engine may wrap `out` in an identity whose backward announces the unit's
  // backward). Calls nest: a unit may be entered again (a tied weight) before it is left.
  virtual Tensor after_forward(int unit, const Tensor& out) = 0;
};

}  // namespace loom
