// tests/conformance/cases/rope.cpp — conformance cases of rope (core/ops/rope.h): one token of
// one pair, odd T, several heads, head dims whose half is odd or a pack multiple, i32 and i64
// positions from 0, and the (2, 9, 3, 64) queries of a layer at random positions in [100, 4000)
// (not sorted, as a context-parallel rank's may be); and those queries under a model's scaled
// RoPE (Llama 3's frequencies and YaRN's cos/sin scale, layers/rope_scaling.h).
#include "core/ops/rope.h"

#include "layers/rope_scaling.h"
#include "tests/conformance/conformance.h"

namespace loom::conformance {
namespace {

Tensor arange(int64_t t, DType dtype) {
  std::vector<int64_t> v(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) v[static_cast<size_t>(i)] = i;
  return Tensor::from_vector(v, {t}).to(dtype);
}

}  // namespace

LOOM_CONFORMANCE_CASES(rope) {
  const std::vector<std::string> kernels = {"rope_forward", "rope_backward"};
  const auto op = [](const Inputs& in) { return Outputs{ops::rope(in[0], in[1], 10000.0)}; };
  const std::vector<std::pair<Shape, DType>> from_zero = {{{1, 1, 1, 2}, DType::kI64},
                                                          {{2, 3, 2, 6}, DType::kI32},
                                                          {{1, 17, 3, 8}, DType::kI64},
                                                          {{2, 17, 1, 64}, DType::kI32}};
  for (const auto& [s, pos_dtype] : from_zero) {
    cases.push_back({.name = shape_name(s) + "_" + dtype_name(pos_dtype),
                     .kernels = kernels,
                     .inputs =
                         [s, pos_dtype](Generator& gen) {
                           return Inputs{grad_input(s, gen), arange(s[1], pos_dtype)};
                         },
                     .op = op});
  }
  const Shape layer = {2, 9, 3, 64};
  const auto layer_inputs = [layer](Generator& gen) {
    Tensor x = grad_input(layer, gen, 3.0);
    return Inputs{x, randint({layer[1]}, 100, 4000, gen, DType::kI64)};
  };
  cases.push_back({.name = shape_name(layer) + "_random_positions",
                   .kernels = kernels,
                   .inputs = layer_inputs,
                   .op = op});
  ModelConfig m;
  m.arch = "llama";
  m.n_embd = 192;
  m.n_head = 3;  // head dim 64
  m.rope_theta = 500000.0;
  m.rope_scaling = {.type = "llama3",
                    .factor = 8,
                    .low_freq_factor = 1,
                    .high_freq_factor = 4,
                    .original_max_seq_len = 512};
  kernels::RopeFrequencies f = rope_frequencies(m);
  f.scale = 1.139;  // YaRN's 0.1·ln(4) + 1
  cases.push_back({.name = shape_name(layer) + "_scaled",
                   .kernels = kernels,
                   .inputs = layer_inputs,
                   .op = [f](const Inputs& in) { return Outputs{ops::rope(in[0], in[1], f)}; }});
}

}  // namespace loom::conformance
