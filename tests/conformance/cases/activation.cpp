// tests/conformance/cases/activation.cpp — conformance cases of gelu, silu and swiglu
// (core/ops/activation.h): odd sizes and ranks, and a transposed (non-contiguous) input.
#include "core/ops/activation.h"

#include "tests/conformance/conformance.h"

namespace loom::conformance {
namespace {

const std::vector<Shape> kShapes = {{1}, {3}, {17}, {65}, {3, 17}, {2, 3, 65}};

}  // namespace

LOOM_CONFORMANCE_CASES(gelu) {
  for (const Shape& s : kShapes) {
    cases.push_back({.name = shape_name(s),
                     .kernels = {"gelu_forward", "gelu_backward"},
                     .inputs = [s](Generator& gen) { return Inputs{grad_input(s, gen, 2.0)}; },
                     .op = [](const Inputs& in) { return Outputs{ops::gelu(in[0])}; }});
  }
  cases.push_back(
      {.name = "17x3_transposed",
       .kernels = {"gelu_forward", "gelu_backward", "copy"},
       .inputs =
           [](Generator& gen) {
             return Inputs{grad_input({17, 3}, gen)};
           },
       .op = [](const Inputs& in) { return Outputs{ops::gelu(in[0].transpose(0, 1))}; }});
}

LOOM_CONFORMANCE_CASES(silu) {
  for (const Shape& s : kShapes) {
    cases.push_back({.name = shape_name(s),
                     .kernels = {"silu_forward", "silu_backward"},
                     .inputs = [s](Generator& gen) { return Inputs{grad_input(s, gen, 2.0)}; },
                     .op = [](const Inputs& in) { return Outputs{ops::silu(in[0])}; }});
  }
}

LOOM_CONFORMANCE_CASES(swiglu) {
  for (const Shape& s : kShapes) {
    cases.push_back({.name = shape_name(s),
                     .kernels = {"swiglu_forward", "swiglu_backward"},
                     .inputs =
                         [s](Generator& gen) {
                           Tensor gate = grad_input(s, gen, 2.0);
                           return Inputs{gate, grad_input(s, gen)};
                         },
                     .op = [](const Inputs& in) { return Outputs{ops::swiglu(in[0], in[1])}; }});
  }
}

}  // namespace loom::conformance
