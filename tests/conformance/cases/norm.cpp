// tests/conformance/cases/norm.cpp — conformance cases of layer_norm (with and without bias),
// rms_norm and residual_layer_norm (both outputs, either one alone) (core/ops/norm.h), at odd
// row counts and widths, and at the (3, 5, 771) rows the transformer layers hand them.
// With C = 1 the true dx is 0 (LayerNorm) or a cancellation 1 − x̂² (RMSNorm), so relative
// errors are meaningless there: those cases are gradient-checked only (the kernel tests in
// tests/cuda/norm_kernel_test.cpp cover C = 1 on the GPU).
#include "core/ops/norm.h"

#include "core/ops/elementwise.h"
#include "tests/conformance/conformance.h"

namespace loom::conformance {
namespace {

const std::vector<Shape> kShapes = {{1, 3}, {3}, {17, 17}, {2, 3, 65}, {65, 1}, {40, 5}};
const Shape kLayerShape = {3, 5, 771};
const std::vector<std::string> kLayerNormKernels = {"layer_norm_forward", "layer_norm_backward"};
const std::vector<std::string> kResidualKernels = {"residual_layer_norm_forward",
                                                   "residual_layer_norm_backward", "binary_forward",
                                                   "sum_dim_forward"};

// The case at shape s: compared everywhere unless C = 1; inputs N(0, std²).
Case norm_case(const Shape& s, double std, std::vector<std::string> kernels,
               std::function<Inputs(const Shape&, Generator&, double)> inputs,
               std::function<Outputs(const Inputs&)> op, const std::string& suffix = "") {
  const bool width_one = s.back() == 1;
  Case c{.name = shape_name(s) + suffix,
         .kernels = std::move(kernels),
         .inputs = [s, std, inputs](Generator& gen) { return inputs(s, gen, std); },
         .op = std::move(op)};
  // N(0, 9) inputs over 11565 elements: Σ out ⊙ w (with the residual sum squared) reaches ~10⁴,
  // and its rounding, over the central difference's 2·10⁻⁶, a few 10⁻⁶.
  if (std > 1.0) c.grad.atol = 1e-5;
  if (width_one) {
    c.dtypes = {};
    c.cpu_f32 = false;
  }
  return c;
}

// x, weight, bias (when `bias`).
Inputs xwb(const Shape& s, Generator& gen, double std, bool bias) {
  Inputs in{grad_input(s, gen, std), grad_input({s.back()}, gen, std)};
  if (bias) in.push_back(grad_input({s.back()}, gen, std));
  return in;
}

// x, r, weight, bias (when `bias`).
Inputs xrwb(const Shape& s, Generator& gen, double std, bool bias) {
  Inputs in{grad_input(s, gen, std), grad_input(s, gen, std), grad_input({s.back()}, gen, std)};
  if (bias) in.push_back(grad_input({s.back()}, gen, std));
  return in;
}

std::vector<std::pair<Shape, double>> shapes_and_scales() {
  std::vector<std::pair<Shape, double>> out;
  for (const Shape& s : kShapes) out.push_back({s, 1.0});
  out.push_back({kLayerShape, 3.0});
  return out;
}

}  // namespace

LOOM_CONFORMANCE_CASES(layer_norm) {
  for (const auto& [s, std] : shapes_and_scales()) {
    cases.push_back(norm_case(
        s, std, kLayerNormKernels,
        [](const Shape& sh, Generator& gen, double sd) { return xwb(sh, gen, sd, true); },
        [](const Inputs& in) { return Outputs{ops::layer_norm(in[0], in[1], in[2])}; }));
    cases.push_back(norm_case(
        s, std, kLayerNormKernels,
        [](const Shape& sh, Generator& gen, double sd) { return xwb(sh, gen, sd, false); },
        [](const Inputs& in) { return Outputs{ops::layer_norm(in[0], in[1], Tensor())}; },
        "_nobias"));
  }
}

LOOM_CONFORMANCE_CASES(rms_norm) {
  for (const auto& [s, std] : shapes_and_scales()) {
    cases.push_back(norm_case(
        s, std, {"rms_norm_forward", "rms_norm_backward"},
        [](const Shape& sh, Generator& gen, double sd) { return xwb(sh, gen, sd, false); },
        [](const Inputs& in) { return Outputs{ops::rms_norm(in[0], in[1], 1e-6)}; }));
  }
}

// "both": the normalised output plus the sum squared (so the sum's gradient depends on its
// value); "normalized_only" (no bias) and "sum_only": one output unused (its gradient absent);
// "outputs" (at the layers' shape): both outputs as they are, each seeded with its own gradient.
LOOM_CONFORMANCE_CASES(residual_layer_norm) {
  for (const auto& [s, std] : shapes_and_scales()) {
    const auto with_bias = [](const Shape& sh, Generator& gen, double sd) {
      return xrwb(sh, gen, sd, true);
    };
    cases.push_back(norm_case(
        s, std, kResidualKernels, with_bias,
        [](const Inputs& in) {
          const ops::ResidualLayerNorm out = ops::residual_layer_norm(in[0], in[1], in[2], in[3]);
          return Outputs{ops::add(out.normalized, ops::mul(out.sum, out.sum))};
        },
        "_both"));
    cases.push_back(norm_case(
        s, std, kResidualKernels,
        [](const Shape& sh, Generator& gen, double sd) { return xrwb(sh, gen, sd, false); },
        [](const Inputs& in) {
          return Outputs{ops::residual_layer_norm(in[0], in[1], in[2], Tensor()).normalized};
        },
        "_normalized_only"));
    cases.push_back(norm_case(
        s, std, kResidualKernels, with_bias,
        [](const Inputs& in) {
          const ops::ResidualLayerNorm out = ops::residual_layer_norm(in[0], in[1], in[2], in[3]);
          return Outputs{ops::mul(out.sum, out.sum)};
        },
        "_sum_only"));
    if (s != kLayerShape) continue;
    cases.push_back(norm_case(
        s, std, kResidualKernels, with_bias,
        [](const Inputs& in) {
          const ops::ResidualLayerNorm out = ops::residual_layer_norm(in[0], in[1], in[2], in[3]);
          return Outputs{out.sum, out.normalized};
        },
        "_outputs"));
  }
}

}  // namespace loom::conformance
