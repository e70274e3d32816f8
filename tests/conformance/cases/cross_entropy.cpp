// tests/conformance/cases/cross_entropy.cpp — conformance cases of softmax_cross_entropy
// (core/ops/cross_entropy.h): ignored rows, a padded vocabulary (columns past vocab_size), both,
// (..., Vp) logits, every target dtype with its own ignore_index, and one-class rows (loss and
// gradient exactly 0: gradient-checked only, a relative error of zeros being meaningless).
#include "core/ops/cross_entropy.h"

#include "core/ops/view.h"
#include "tests/conformance/conformance.h"

namespace loom::conformance {
namespace {

struct Ce {
  Shape logits;
  int64_t vocab;         // <= 0: all columns
  int64_t ignore_every;  // 0: no ignored rows; else rows with i % ignore_every == 1
  DType target_dtype;
  int64_t ignore_index;
  std::string what;
};

// Targets (the logits' leading shape) in [0, vocab), some rows set to ignore_index.
Tensor targets(const Ce& c, Generator& gen) {
  const Shape lead(c.logits.begin(), c.logits.end() - 1);
  const int64_t n = shape_numel(lead), vocab = c.vocab > 0 ? c.vocab : c.logits.back();
  const std::vector<double> r = randint({n}, 0, vocab, gen).to_vector();
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) {
    const bool ignored = c.ignore_every > 0 && i % c.ignore_every == 1;
    v.push_back(ignored ? c.ignore_index : static_cast<int64_t>(r[static_cast<size_t>(i)]));
  }
  return ops::reshape(Tensor::from_vector(v, {n}).to(c.target_dtype), lead);
}

}  // namespace

LOOM_CONFORMANCE_CASES(cross_entropy) {
  const std::vector<Ce> all = {
      {{1, 5}, -1, 0, DType::kI64, -100, "plain"},
      {{3, 17}, -1, 2, DType::kI32, -100, "ignored"},
      {{17, 8}, 6, 0, DType::kI64, -100, "padded"},
      {{17, 9}, 5, 3, DType::kU16, 65535, "padded_ignored"},
      {{2, 3, 7}, -1, 4, DType::kU32, 7, "ignored"},
      {{4, 1}, -1, 0, DType::kI64, -100, "one_class"},
  };
  for (const Ce& c : all) {
    Case k{.name = shape_name(c.logits) + "_" + c.what + "_" + dtype_name(c.target_dtype),
           .kernels = {"cross_entropy_forward", "cross_entropy_backward", "sum_dim_forward",
                       "scale_forward"},
           .inputs =
               [c](Generator& gen) {
                 Tensor logits = grad_input(c.logits, gen, 2.0);
                 return Inputs{logits, targets(c, gen)};
               },
           .op =
               [c](const Inputs& in) {
                 return Outputs{ops::softmax_cross_entropy(in[0], in[1], c.ignore_index, c.vocab)};
               }};
    if (c.logits.back() == 1) k.dtypes = {};
    cases.push_back(k);
  }
}

}  // namespace loom::conformance
