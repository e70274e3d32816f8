// tests/core/ops/matmul_test.cpp — matmul values against an explicit triple loop, the folded
// Linear form's shape, the gemm kernel's beta == 0 contract, the OpenBLAS core, shape errors.
// Gradients in every transpose form, batched, folded and on strided views (finite differences
// in f64, f32 against f64, other backends) are the conformance table's matmul cases
// (tests/conformance/cases/matmul.cpp).
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

using testing::random;

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
  // x (B, T, C) · wᵀ with w (N, C): one GEMM (its gradients: the table's matmul__fold_* case).
  Generator gen(13);
  Tensor x = random({2, 3, 17}, gen), w = random({5, 17}, gen);
  EXPECT_EQ(ops::matmul(x, w, false, true).shape(), (Shape{2, 3, 5}));
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
