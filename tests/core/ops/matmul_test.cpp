// tests/core/ops/matmul_test.cpp — matmul in every transpose form, batched and folded, against
// finite differences (f64) and an explicit triple loop; f32 against f64.
#include "core/ops/matmul.h"

#include <strings.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "core/ops/view.h"
#include "kernels/matmul.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::expect_f32_matches_f64;
using testing::expect_gradcheck;
using testing::random;

struct MmCase {
  int64_t b, m, k, n;  // b = 0: 2-d
};

class MatmulTest : public ::testing::TestWithParam<MmCase> {};

Shape dims(int64_t b, int64_t r, int64_t c) { return b ? Shape{b, r, c} : Shape{r, c}; }

TEST_P(MatmulTest, AllTransposeFormsGradcheck) {
  const MmCase c = GetParam();
  Generator gen(11);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Tensor a = random(ta ? dims(c.b, c.k, c.m) : dims(c.b, c.m, c.k), gen);
      Tensor b = random(tb ? dims(c.b, c.n, c.k) : dims(c.b, c.k, c.n), gen);
      auto fn = [ta, tb](const std::vector<Tensor>& in) {
        return ops::matmul(in[0], in[1], ta, tb);
      };
      expect_gradcheck(fn, {a, b});
      expect_f32_matches_f64(fn, {a, b}, 1e-5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulTest,
                         ::testing::Values(MmCase{0, 1, 1, 1}, MmCase{0, 3, 17, 5},
                                           MmCase{0, 17, 3, 65}, MmCase{2, 3, 5, 7},
                                           MmCase{3, 1, 17, 3}),
                         [](const auto& info) {
                           const MmCase& c = info.param;
                           return "b" + std::to_string(c.b) + "_m" + std::to_string(c.m) + "_k" +
                                  std::to_string(c.k) + "_n" + std::to_string(c.n);
                         });

TEST(Matmul, ValuesAgainstTripleLoop) {
  Generator gen(12);
  Tensor a = random({5, 7}, gen, DType::kF64, false), b = random({7, 3}, gen, DType::kF64, false);
  Tensor c = ops::matmul(a, b);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      double ref = 0;
      for (int64_t k = 0; k < 7; ++k) ref += a.at({i, k}) * b.at({k, j});
      EXPECT_NEAR(c.at({i, j}), ref, 1e-12);
    }
}

TEST(Matmul, LinearFormFoldsLeadingDims) {
  // x (B, T, C) · wᵀ with w (N, C): one GEMM; gradient of w sums over B·T.
  Generator gen(13);
  Tensor x = random({2, 3, 17}, gen), w = random({5, 17}, gen);
  auto fn = [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1], false, true); };
  expect_gradcheck(fn, {x, w});
  EXPECT_EQ(fn({x, w}).shape(), (Shape{2, 3, 5}));
}

TEST(Matmul, StridedAndTransposedViewOperands) {
  // Transposed views go to BLAS with a flag; narrowed rows keep their row stride.
  Generator gen(14);
  Tensor base = random({9, 17}, gen);
  Tensor b = random({6, 4}, gen);
  auto fn = [](const std::vector<Tensor>& in) {
    return ops::matmul(in[0].narrow(0, 2, 6).transpose(0, 1), in[1]);  // (17, 6) · (6, 4)
  };
  expect_gradcheck(fn, {base, b});
  Tensor batched = random({4, 3, 5}, gen);
  auto fb = [](const std::vector<Tensor>& in) {
    return ops::matmul(in[0].transpose(1, 2), in[0]);  // (4, 5, 3) · (4, 3, 5)
  };
  expect_gradcheck(fb, {batched});
}

// The gemm kernel's contract (kernels/matmul.h): with beta == 0, c is not read — also when the
// inner dimension is 0 (c = beta · c then), so NaN left in c does not survive.
TEST(Matmul, GemmWithBetaZeroDoesNotReadC) {
  for (const int64_t k : {int64_t{0}, int64_t{3}}) {
    const Tensor a = Tensor::ones({4, k}), b = Tensor::ones({k, 5});
    Tensor c = Tensor::full({4, 5}, std::nan(""));
    kernels::call_kernel<kernels::gemm_k>(a, b, c, false, false, 1.0, 0.0);
    EXPECT_EQ(c.to_vector(), std::vector<double>(20, static_cast<double>(k))) << "k " << k;
  }
  Tensor c = Tensor::full({2, 2}, 3.0);  // beta != 0 with k == 0: c scaled
  kernels::call_kernel<kernels::gemm_k>(Tensor::ones({2, 0}), Tensor::ones({0, 2}), c, false, false,
                                        1.0, 0.5);
  EXPECT_EQ(c.to_vector(), std::vector<double>(4, 1.5));
}

// The OpenBLAS kernel set reported for the start line is the one OpenBLAS runs: named, and the
// forced one when the environment forces it (OPENBLAS_CORETYPE, compared without case).
TEST(Matmul, ReportsTheOpenBlasCoreItRuns) {
  const std::string core = kernels::cpu_blas_core();
  EXPECT_FALSE(core.empty());
  EXPECT_NE(core, "Unknown");
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced && *forced) {
    EXPECT_EQ(strcasecmp(core.c_str(), forced), 0) << core << " vs OPENBLAS_CORETYPE=" << forced;
  }
}

TEST(Matmul, ShapeErrorsNameTheDims) {
  Tensor a = Tensor::zeros({3, 4}), b = Tensor::zeros({5, 6});
  EXPECT_THROW(ops::matmul(a, b), Error);
  EXPECT_THROW(ops::matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 4, 5})), Error);
}

}  // namespace
}  // namespace loom
