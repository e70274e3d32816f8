// tests/conformance/cases/reduce.cpp — conformance cases of sum, mean and sum_squares
// (core/ops/reduce.h). One case per shape returns every reduction of it (each dim, with and
// without keepdim, and the whole tensor), so every output's gradient is checked at once.
#include "core/ops/reduce.h"

#include "tests/conformance/conformance.h"

namespace loom::conformance {
namespace {

const std::vector<Shape> kShapes = {{1}, {3, 17}, {2, 65, 3}};

using DimFn = Tensor (*)(const Tensor&, int64_t, bool);
using AllFn = Tensor (*)(const Tensor&);

void add_reductions(std::vector<Case>& cases, DimFn dim_fn, AllFn all_fn) {
  for (const Shape& s : kShapes) {
    cases.push_back({.name = shape_name(s),
                     .kernels = {"sum_dim_forward", "scale_forward", "copy"},
                     .inputs = [s](Generator& gen) { return Inputs{grad_input(s, gen)}; },
                     .op =
                         [dim_fn, all_fn](const Inputs& in) {
                           Outputs out;
                           for (int64_t d = 0; d < in[0].dim(); ++d) {
                             for (bool keep : {false, true}) out.push_back(dim_fn(in[0], d, keep));
                           }
                           out.push_back(all_fn(in[0]));
                           return out;
                         }});
  }
}

}  // namespace

LOOM_CONFORMANCE_CASES(sum) {
  add_reductions(
      cases, [](const Tensor& x, int64_t d, bool keep) { return ops::sum(x, d, keep); },
      [](const Tensor& x) { return ops::sum(x); });
}

LOOM_CONFORMANCE_CASES(mean) {
  add_reductions(
      cases, [](const Tensor& x, int64_t d, bool keep) { return ops::mean(x, d, keep); },
      [](const Tensor& x) { return ops::mean(x); });
}

LOOM_CONFORMANCE_CASES(sum_squares) {
  for (const Shape& s : {Shape{1}, Shape{3, 17}}) {
    cases.push_back({.name = shape_name(s),
                     .kernels = {"sum_squares_forward", "binary_forward", "scale_forward"},
                     .inputs = [s](Generator& gen) { return Inputs{grad_input(s, gen)}; },
                     .op = [](const Inputs& in) { return Outputs{ops::sum_squares(in[0])}; },
                     .cpu_f32 = false});  // the sum is f64 for every input dtype
  }
}

}  // namespace loom::conformance
