// tests/conformance/cases/elementwise.cpp — conformance cases of add, sub, mul, div (NumPy
// broadcasting: bias rows, middle and scalar-like broadcasts, both operands broadcast) and scale
// (core/ops/elementwise.h). The broadcast operands' gradients are summed back by sum_to_shape.
#include "core/ops/elementwise.h"

#include "tests/conformance/conformance.h"

namespace loom::conformance {
namespace {

struct Pair {
  Shape a, b;
  std::string name;
};

const std::vector<Pair> kPairs = {{{3, 17}, {3, 17}, "3x17"},
                                  {{1}, {1}, "1"},
                                  {{3, 17}, {17}, "3x17_by_17"},              // bias
                                  {{2, 3, 5}, {3, 1}, "2x3x5_by_3x1"},        // middle broadcast
                                  {{65}, {1}, "65_by_1"},                     // scalar-like
                                  {{4, 1, 3}, {1, 5, 1}, "4x1x3_by_1x5x1"}};  // both broadcast

const std::vector<std::string> kKernels = {"binary_forward", "scale_forward", "sum_dim_forward"};

using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);

void add_binary(std::vector<Case>& cases, BinaryFn fn) {
  for (const Pair& p : kPairs) {
    cases.push_back({.name = p.name,
                     .kernels = kKernels,
                     .inputs =
                         [p](Generator& gen) {
                           return Inputs{grad_input(p.a, gen), grad_input(p.b, gen)};
                         },
                     .op = [fn](const Inputs& in) { return Outputs{fn(in[0], in[1])}; }});
  }
}

}  // namespace

LOOM_CONFORMANCE_CASES(add) { add_binary(cases, ops::add); }
LOOM_CONFORMANCE_CASES(sub) { add_binary(cases, ops::sub); }
LOOM_CONFORMANCE_CASES(mul) { add_binary(cases, ops::mul); }

// Divisors in [1.5, 2.5): away from zero, so the quotient and its gradient stay moderate (and
// fit f16).
LOOM_CONFORMANCE_CASES(div) {
  for (const Pair& p : kPairs) {
    cases.push_back({.name = p.name,
                     .kernels = kKernels,
                     .inputs =
                         [p](Generator& gen) {
                           return Inputs{grad_input(p.a, gen), grad_uniform(p.b, gen, 1.5, 2.5)};
                         },
                     .op = [](const Inputs& in) { return Outputs{ops::div(in[0], in[1])}; }});
  }
}

LOOM_CONFORMANCE_CASES(scale) {
  cases.push_back({.name = "3x17",
                   .kernels = {"scale_forward"},
                   .inputs =
                       [](Generator& gen) {
                         return Inputs{grad_input({3, 17}, gen)};
                       },
                   .op = [](const Inputs& in) { return Outputs{ops::scale(in[0], -2.5)}; }});
}

}  // namespace loom::conformance
