// tests/core/ops/cross_entropy_test.cpp — softmax_cross_entropy: loss and gradient against a
// log-softmax loop, ignored rows, padded vocabulary, all rows ignored, bad targets, and
// thread-count independence. Gradients at these cases (finite differences in f64, f32 against
// f64, other backends) are the conformance table's cross_entropy cases
// (tests/conformance/cases/cross_entropy.cpp).
#include "core/ops/cross_entropy.h"

#include <omp.h>

#include <cmath>

#include "core/ops/view.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::random;

// Random targets in [0, vocab), with every `ignore_every`-th row set to ignore_index.
Tensor make_targets(int64_t n, int64_t vocab, int64_t ignore_every, int64_t ignore_index,
                    Generator& gen, DType dtype = DType::kI64) {
  std::vector<double> r = randint({n}, 0, vocab, gen).to_vector();
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) {
    v.push_back(ignore_every > 0 && i % ignore_every == 1 ? ignore_index
                                                          : static_cast<int64_t>(r[i]));
  }
  return Tensor::from_vector(v, {n}).to(dtype);
}

struct Reference {
  double loss = 0;
  std::vector<double> grad;  // d loss / d logits, (N, Vp)
};

// Loop reference: log-softmax over the first `vocab` columns, mean over non-ignored rows.
Reference ce_reference(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                       int64_t vocab) {
  const int64_t vp = logits.size(-1), n = logits.numel() / vp;
  const std::vector<double> x = logits.to_vector(), t = targets.to_vector();
  Reference ref;
  ref.grad.assign(x.size(), 0.0);
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r) count += static_cast<int64_t>(t[r]) != ignore_index;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t tr = static_cast<int64_t>(t[r]);
    if (tr == ignore_index) continue;
    double m = -INFINITY, l = 0;
    for (int64_t j = 0; j < vocab; ++j) m = std::max(m, x[r * vp + j]);
    for (int64_t j = 0; j < vocab; ++j) l += std::exp(x[r * vp + j] - m);
    const double lse = m + std::log(l);
    ref.loss += (lse - x[r * vp + tr]) / static_cast<double>(count);
    for (int64_t j = 0; j < vocab; ++j) {
      ref.grad[r * vp + j] =
          (std::exp(x[r * vp + j] - lse) - (j == tr)) / static_cast<double>(count);
    }
  }
  return ref;
}

struct CeCase {
  Shape logits;
  int64_t vocab;         // <= 0: all columns
  int64_t ignore_every;  // 0: no ignored rows
  DType target_dtype;
  int64_t ignore_index = -100;
};

class CrossEntropyTest : public ::testing::TestWithParam<CeCase> {};

TEST_P(CrossEntropyTest, ValuesMatchReferenceLoop) {
  Generator gen(41);
  const CeCase c = GetParam();
  const int64_t vp = c.logits.back(), vocab = c.vocab > 0 ? c.vocab : vp;
  Tensor logits = random(c.logits, gen, DType::kF64, true, 2.0);
  Shape lead(c.logits.begin(), c.logits.end() - 1);
  Tensor targets = ops::reshape(
      make_targets(shape_numel(lead), vocab, c.ignore_every, c.ignore_index, gen, c.target_dtype),
      lead);
  Tensor loss = ops::softmax_cross_entropy(logits, targets, c.ignore_index, c.vocab);
  ASSERT_EQ(loss.dim(), 0);
  autograd::backward(loss);
  const Reference ref = ce_reference(logits, targets, c.ignore_index, vocab);
  EXPECT_NEAR(loss.item(), ref.loss, 1e-12 * (1 + std::abs(ref.loss)));
  EXPECT_LT(testing::rel_error(logits.grad().to_vector(), ref.grad), 1e-12);
  const std::vector<double> g = logits.grad().to_vector();
  for (size_t i = 0; i < g.size(); ++i) {
    if (static_cast<int64_t>(i) % vp >= vocab) {
      EXPECT_EQ(g[i], 0.0) << "padding column, element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CrossEntropyTest,
                         ::testing::Values(CeCase{{1, 5}, -1, 0, DType::kI64},
                                           CeCase{{3, 17}, -1, 2, DType::kI32},  // ignored rows
                                           CeCase{{17, 8}, 6, 0, DType::kI64},   // padded vocab
                                           CeCase{{17, 9}, 5, 3, DType::kU16, 65535},  // both
                                           CeCase{{2, 3, 7}, -1, 4, DType::kU32, 7},   // (..., Vp)
                                           CeCase{{4, 1}, -1, 0, DType::kI64}));       // one class

TEST(CrossEntropy, PaddingValuesDoNotMatter) {
  Generator gen(42);
  Tensor logits = random({5, 10}, gen, DType::kF64, false);
  Tensor targets = make_targets(5, 7, 0, -100, gen);
  const double a = ops::softmax_cross_entropy(logits, targets, -100, 7).item();
  Tensor padded =
      ops::cat({ops::narrow(logits, 1, 0, 7), Tensor::full({5, 3}, 1e4, DType::kF64)}, 1);
  EXPECT_EQ(ops::softmax_cross_entropy(padded, targets, -100, 7).item(), a);
}

TEST(CrossEntropy, AllIgnoredGivesZeroLossAndGradient) {
  Generator gen(43);
  Tensor logits = random({4, 6}, gen);
  Tensor targets = Tensor::from_vector(std::vector<int32_t>{7, 7, 7, 7}, {4});
  Tensor loss = ops::softmax_cross_entropy(logits, targets, /*ignore_index=*/7);
  EXPECT_EQ(loss.item(), 0.0);
  autograd::backward(loss);
  for (double g : logits.grad().to_vector()) EXPECT_EQ(g, 0.0);
}

TEST(CrossEntropy, IgnoredRowsGetZeroGradient) {
  Generator gen(44);
  Tensor logits = random({6, 5}, gen);
  Tensor targets = make_targets(6, 5, 2, -1, gen);  // rows 1, 3, 5 ignored
  autograd::backward(ops::softmax_cross_entropy(logits, targets, -1));
  const std::vector<double> g = logits.grad().to_vector();
  for (int64_t r : {1, 3, 5}) {
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(g[r * 5 + j], 0.0);
  }
}

TEST(CrossEntropy, OutOfRangeTargetNamesRowAndValue) {
  Tensor logits = Tensor::zeros({4, 6});
  Tensor targets = Tensor::from_vector(std::vector<int64_t>{0, 5, -100, 6}, {4});
  try {
    ops::softmax_cross_entropy(logits, targets, -100, 6);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 6 at row 3"), std::string::npos) << e.what();
  }
  Tensor negative = Tensor::from_vector(std::vector<int64_t>{0, -3, 1, 1}, {4});
  EXPECT_THROW(ops::softmax_cross_entropy(logits, negative), Error);
  // A padded column is out of range too.
  EXPECT_THROW(ops::softmax_cross_entropy(logits, targets, -100, 5), Error);
}

TEST(CrossEntropy, SameBitsForAnyThreadCount) {
  Generator gen(45);
  Tensor logits = random({64, 1031}, gen, DType::kF32);
  Tensor targets = make_targets(64, 1000, 5, -100, gen);
  const int saved = omp_get_max_threads();
  std::vector<double> ref_loss, ref_grad;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    logits.zero_grad();
    Tensor loss = ops::softmax_cross_entropy(logits, targets, -100, 1000);
    autograd::backward(loss);
    if (ref_grad.empty()) {
      ref_loss = loss.to_vector();
      ref_grad = logits.grad().to_vector();
    } else {
      EXPECT_EQ(loss.to_vector(), ref_loss) << threads << " threads";
      EXPECT_EQ(logits.grad().to_vector(), ref_grad) << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace loom
