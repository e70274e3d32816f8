// tests/conformance/cases/matmul.cpp — conformance cases of matmul (core/ops/matmul.h): every
// transpose form, 2-d and batched, 1×1×1 and odd sizes; a (B, T, C) · wᵀ product with the
// leading dims folded into M; and strided and transposed view operands (a narrowed then
// transposed matrix, a batch multiplied by its own transpose).
#include "core/ops/matmul.h"

#include "tests/conformance/conformance.h"

namespace loom::conformance {
namespace {

struct Mm {
  int64_t b, m, k, n;  // b = 0: 2-d
};

Shape dims(int64_t b, int64_t r, int64_t c) { return b ? Shape{b, r, c} : Shape{r, c}; }

const std::vector<std::string> kKernels = {"gemm", "copy"};

}  // namespace

LOOM_CONFORMANCE_CASES(matmul) {
  for (const Mm& c :
       {Mm{0, 1, 1, 1}, Mm{0, 3, 17, 5}, Mm{0, 17, 3, 65}, Mm{2, 3, 5, 7}, Mm{3, 1, 17, 3}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Shape sa = ta ? dims(c.b, c.k, c.m) : dims(c.b, c.m, c.k);
        const Shape sb = tb ? dims(c.b, c.n, c.k) : dims(c.b, c.k, c.n);
        cases.push_back(
            {.name = "b" + std::to_string(c.b) + "_m" + std::to_string(c.m) + "_k" +
                     std::to_string(c.k) + "_n" + std::to_string(c.n) + (ta ? "_ta" : "") +
                     (tb ? "_tb" : ""),
             .kernels = kKernels,
             .inputs =
                 [sa, sb](Generator& gen) {
                   Tensor a = grad_input(sa, gen);
                   return Inputs{a, grad_input(sb, gen)};
                 },
             .op = [ta,
                    tb](const Inputs& in) { return Outputs{ops::matmul(in[0], in[1], ta, tb)}; }});
      }
    }
  }
  cases.push_back(
      {.name = "fold_2x3x17_by_5x17_tb",
       .kernels = kKernels,
       .inputs =
           [](Generator& gen) {
             Tensor x = grad_input({2, 3, 17}, gen);
             return Inputs{x, grad_input({5, 17}, gen)};
           },
       .op = [](const Inputs& in) { return Outputs{ops::matmul(in[0], in[1], false, true)}; }});
  // Rows 2..7 of a (9, 17) matrix, transposed: (17, 6) · (6, 4) with a row stride of 17.
  cases.push_back({.name = "narrowed_transposed_view",
                   .kernels = kKernels,
                   .inputs =
                       [](Generator& gen) {
                         Tensor base = grad_input({9, 17}, gen);
                         return Inputs{base, grad_input({6, 4}, gen)};
                       },
                   .op =
                       [](const Inputs& in) {
                         return Outputs{ops::matmul(in[0].narrow(0, 2, 6).transpose(0, 1), in[1])};
                       }});
  // (4, 5, 3) · (4, 3, 5): a batch times its own transpose.
  cases.push_back(
      {.name = "batched_self_transposed",
       .kernels = kKernels,
       .inputs =
           [](Generator& gen) {
             return Inputs{grad_input({4, 3, 5}, gen)};
           },
       .op = [](const Inputs& in) { return Outputs{ops::matmul(in[0].transpose(1, 2), in[0])}; }});
}

}  // namespace loom::conformance
