// tests/conformance/cases/softmax.cpp — conformance cases of softmax over the last dim
// (core/ops/softmax.h): odd row lengths and counts, one-element rows (output 1, gradient 0:
// gradient-checked only, a relative error of zeros being meaningless), a transposed input, and
// the (4, 7, 129) rows of attention-sized scores.
#include "core/ops/softmax.h"

#include "tests/conformance/conformance.h"

namespace loom::conformance {

LOOM_CONFORMANCE_CASES(softmax) {
  const std::vector<std::string> kernels = {"softmax_forward", "softmax_backward"};
  const auto op = [](const Inputs& in) { return Outputs{ops::softmax(in[0])}; };
  for (const Shape& s : {Shape{1}, Shape{3}, Shape{17}, Shape{65}, Shape{4, 65}, Shape{2, 3, 17},
                         Shape{5, 1}, Shape{4, 7, 129}}) {
    const double std = s.size() == 3 && s[2] == 129 ? 3.0 : 2.0;
    Case c{.name = shape_name(s),
           .kernels = kernels,
           .inputs = [s, std](Generator& gen) { return Inputs{grad_input(s, gen, std)}; },
           .op = op};
    if (s.back() == 1) c.dtypes = {};
    cases.push_back(c);
  }
  cases.push_back(
      {.name = "17x3_transposed",
       .kernels = {"softmax_forward", "softmax_backward", "copy"},
       .inputs =
           [](Generator& gen) {
             return Inputs{grad_input({17, 3}, gen)};
           },
       .op = [](const Inputs& in) { return Outputs{ops::softmax(in[0].transpose(0, 1))}; }});
}

}  // namespace loom::conformance
