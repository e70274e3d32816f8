// tests/conformance/cases/attention.cpp — conformance cases of causal_attention
// (core/ops/attention.h): one token, multi-head, grouped- and multi-query heads, odd T and odd
// head sizes, an explicit scale, and the (B, T, H, D) views a layer hands it, transposed to
// (B, H, T, D). The CUDA kernels take f32, bf16 and f16 (not f64). With one token the output is
// v and dq is exactly 0, so that case is gradient-checked only (a relative error of zeros is
// meaningless).
#include "core/ops/attention.h"

#include "core/ops/view.h"
#include "tests/conformance/conformance.h"

namespace loom::conformance {

LOOM_CONFORMANCE_CASES(attention) {
  struct Attn {
    int64_t b, hq, hkv, t, d;
    double scale;  // <= 0: 1/sqrt(D)
    std::string what;
  };
  const std::vector<std::string> kernels = {"attention_forward", "attention_backward"};
  for (const Attn& a : {Attn{1, 1, 1, 1, 3, 0.0, "one_token"}, Attn{2, 2, 2, 3, 8, 0.0, "mha"},
                        Attn{1, 2, 2, 17, 3, 0.7, "mha_scaled"}, Attn{1, 4, 2, 17, 3, 0.0, "gqa"},
                        Attn{2, 4, 2, 17, 8, 0.0, "gqa"}, Attn{2, 3, 1, 5, 4, 0.0, "mqa"}}) {
    Case c{.name = "B" + std::to_string(a.b) + "_Hq" + std::to_string(a.hq) + "_Hkv" +
                   std::to_string(a.hkv) + "_T" + std::to_string(a.t) + "_D" + std::to_string(a.d) +
                   "_" + a.what,
           .kernels = kernels,
           .inputs =
               [a](Generator& gen) {
                 Tensor q = grad_input({a.b, a.hq, a.t, a.d}, gen);
                 Tensor k = grad_input({a.b, a.hkv, a.t, a.d}, gen);
                 return Inputs{q, k, grad_input({a.b, a.hkv, a.t, a.d}, gen)};
               },
           .op =
               [scale = a.scale](const Inputs& in) {
                 return Outputs{ops::causal_attention(in[0], in[1], in[2], scale)};
               },
           .dtypes = kNoF64};
    if (a.t == 1) c.dtypes = {};
    cases.push_back(c);
  }
  cases.push_back({.name = "strided_BTHD_views",
                   .kernels = {"attention_forward", "attention_backward", "copy"},
                   .inputs =
                       [](Generator& gen) {
                         Tensor q = grad_input({2, 5, 4, 6}, gen);
                         Tensor k = grad_input({2, 5, 2, 6}, gen);
                         return Inputs{q, k, grad_input({2, 5, 2, 6}, gen)};
                       },
                   .op =
                       [](const Inputs& in) {
                         return Outputs{ops::causal_attention(ops::transpose(in[0], 1, 2),
                                                              ops::transpose(in[1], 1, 2),
                                                              ops::transpose(in[2], 1, 2))};
                       },
                   .dtypes = kNoF64});
}

}  // namespace loom::conformance
