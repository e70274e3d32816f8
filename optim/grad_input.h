// optim/grad_input.h — internal helper shared by the optimisers: a parameter's gradient made
// ready for an update kernel (same shape checked, converted to the parameter's dtype,
// contiguous). Not part of the public optimiser API.
#pragma once

#include "optim/optimizer.h"

namespace loom::optim::detail {

// The gradient of p ready for an update, or an undefined tensor when p has no gradient.
inline Tensor grad_for_update(const ParamRef& p, const char* who) {
  Tensor g = p.param.grad();
  if (!g.defined()) return g;
  LOOM_CHECK(g.shape() == p.param.shape(), who, ": gradient of '", p.name, "' has shape ",
             shape_str(g.shape()), ", parameter has ", shape_str(p.param.shape()));
  LOOM_CHECK(g.device() == p.param.device(), who, ": gradient of '", p.name, "' is on ",
             g.device().str(), ", parameter on ", p.param.device().str());
  if (g.dtype() != p.param.dtype()) g = g.to(p.param.dtype());
  return g.contiguous();
}

}  // namespace loom::optim::detail
