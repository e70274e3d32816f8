// tests/conformance/cases/linear.cpp — conformance cases of the fused Linear ops
// (core/ops/matmul.h): linear with and without bias, linear_gelu and gelu_mlp (all five inputs
// differentiated, and with the fc layer frozen), at 1×1 and odd sizes, and linear / linear_gelu
// at the (2, 33, 96) · (40, 96)ᵀ of a small layer.
#include "core/ops/matmul.h"
#include "tests/conformance/conformance.h"

namespace loom::conformance {
namespace {

struct Lin {
  Shape x;
  int64_t out;
};
const std::vector<Lin> kLinear = {{{1, 1}, 1}, {{3, 17}, 5}, {{2, 3, 7}, 9}, {{17, 4}, 65}};

struct Mlp {
  Shape x;
  int64_t hidden;
};
const std::vector<Mlp> kMlp = {{{1, 1}, 1}, {{3, 5}, 7}, {{2, 3, 4}, 16}, {{9, 6}, 2}};

std::string lin_name(const Lin& l) { return shape_name(l.x) + "_out" + std::to_string(l.out); }

// x, w (out, in) and, when `bias`, b (out); N(0, std²).
std::function<Inputs(Generator&)> lin_inputs(const Lin& l, bool bias, double std = 1.0) {
  return [l, bias, std](Generator& gen) {
    Inputs in{grad_input(l.x, gen, std), grad_input({l.out, l.x.back()}, gen, std)};
    if (bias) in.push_back(grad_input({l.out}, gen, std));
    return in;
  };
}

const std::vector<std::string> kLinearKernels = {"gemm", "gemm_bias", "sum_dim_forward"};
const std::vector<std::string> kLinearGeluKernels = {"gemm", "gemm_bias_gelu", "gelu_backward",
                                                     "sum_dim_forward"};

Outputs linear_op(const Inputs& in) { return {ops::linear(in[0], in[1], in[2])}; }
Outputs linear_gelu_op(const Inputs& in) { return {ops::linear_gelu(in[0], in[1], in[2])}; }

}  // namespace

LOOM_CONFORMANCE_CASES(linear) {
  std::vector<Lin> all = kLinear;
  all.push_back({{2, 33, 96}, 40});
  for (const Lin& l : all) {
    const double std = l.out == 40 ? 3.0 : 1.0;
    cases.push_back({.name = lin_name(l),
                     .kernels = kLinearKernels,
                     .inputs = lin_inputs(l, true, std),
                     .op = linear_op});
    cases.push_back(
        {.name = lin_name(l) + "_nobias",
         .kernels = kLinearKernels,
         .inputs = lin_inputs(l, false, std),
         .op = [](const Inputs& in) { return Outputs{ops::linear(in[0], in[1], Tensor())}; }});
  }
}

LOOM_CONFORMANCE_CASES(linear_gelu) {
  std::vector<Lin> all = kLinear;
  all.push_back({{2, 33, 96}, 40});
  for (const Lin& l : all) {
    cases.push_back({.name = lin_name(l),
                     .kernels = kLinearGeluKernels,
                     .inputs = lin_inputs(l, true, l.out == 40 ? 3.0 : 1.0),
                     .op = linear_gelu_op});
  }
}

// x (…, C), w_fc (H, C), b_fc (H), w_proj (C, H), b_proj (C); "frozen_fc": w_fc and b_fc
// constants (the backward's branch without dpre's bias gradient).
LOOM_CONFORMANCE_CASES(gelu_mlp) {
  const std::vector<std::string> kernels = {
      "gemm", "gemm_bias", "gemm_bias_gelu", "gemm_dgelu_bgrad", "gelu_forward", "sum_dim_forward"};
  const auto op = [](const Inputs& in) {
    return Outputs{ops::gelu_mlp(in[0], in[1], in[2], in[3], in[4])};
  };
  for (const Mlp& m : kMlp) {
    for (bool frozen : {false, true}) {
      if (frozen && m.hidden != 7) continue;
      cases.push_back(
          {.name = shape_name(m.x) + "_hidden" + std::to_string(m.hidden) +
                   (frozen ? "_frozen_fc" : ""),
           .kernels = kernels,
           .inputs =
               [m, frozen](Generator& gen) {
                 const int64_t c = m.x.back(), h = m.hidden;
                 Tensor x = grad_input(m.x, gen);
                 Tensor w1 = frozen ? const_input({h, c}, gen) : grad_input({h, c}, gen);
                 Tensor b1 = frozen ? const_input({h}, gen) : grad_input({h}, gen);
                 Tensor w2 = grad_input({c, h}, gen);
                 return Inputs{x, w1, b1, w2, grad_input({c}, gen)};
               },
           .op = op});
    }
  }
}

}  // namespace loom::conformance
