// tests/cuda/matmul_kernel_test.cpp — the CUDA GEMM kernels (kernels/cuda/matmul.cu) against the
// CPU kernels on fresh random inputs (the seed is printed on failure): every transpose form,
// 2-d and batched, odd sizes and GPT-2 shapes, strided and misaligned operands, alpha/beta with
// a random c, the fused bias / bias+GELU epilogues and the GELU-backward + bias-gradient one
// (gemm_dgelu_bgrad: dpre and dbias both checked); ops::linear and ops::linear_gelu on CUDA
// tensors, forward and backward, are the conformance table's linear and linear_gelu cases
// (tests/conformance/cases/linear.cpp). The CPU reference for bf16/f16 runs in
// f32 on the 16-bit values upcast. Tolerances (relative error ‖got − want‖/‖want‖, NaN never
// passes): f64 1e-12, f32 1e-5 (exact FP32: TF32 would fail it), TF32 5e-3, bf16/f16 1e-2.
// Uses only Loom's API, so it builds without CUDA; each test skips itself with the reason when
// no GPU is present.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers

struct Dims {
  int64_t m, n, k;
};

double tolerance(DType dt, bool tf32) {
  switch (dt) {
    case DType::kF64:
      return 1e-12;
    case DType::kF32:
      return tf32 ? 5e-3 : 1e-5;
    default:
      return 1e-2;
  }
}

// rel_error with a floor for f16's subnormal range: below f16's smallest normal value (2^-14)
// its spacing is a constant 2^-24, so one rounding of a value there is not small relative to it
// (the first GPU run: GELU of a 1×1 product deep in its negative tail, ~1e-6, off by 4 %, one
// f16 step). The error is measured against max(‖want‖, √n·2^-14); other dtypes as rel_error.
double output_error(const Tensor& want, const Tensor& got, DType dt) {
  const double base = rel_error(want, got);
  if (dt != DType::kF16 || !std::isfinite(base)) return base;
  const std::vector<double> a = want.to(Device::cpu()).contiguous().to_vector();
  double sq = 0;
  for (double v : a) sq += v * v;
  const double floor_sq = static_cast<double>(a.size()) * std::ldexp(1.0, -28);
  return sq >= floor_sq ? base : base * std::sqrt(sq / floor_sq);
}

// The dtype the CPU reference computes in.
DType ref_dtype(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

std::string label(DType dt, const Dims& d, int64_t batch, bool ta, bool tb) {
  return std::string(dtype_name(dt)) + " m" + std::to_string(d.m) + " n" + std::to_string(d.n) +
         " k" + std::to_string(d.k) + " batch" + std::to_string(batch) + " ta" +
         std::to_string(ta) + " tb" + std::to_string(tb);
}

Shape mat(int64_t batch, int64_t r, int64_t c) { return batch ? Shape{batch, r, c} : Shape{r, c}; }

class CudaGemmTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    seed_ = std::random_device{}();
  }
  uint64_t seed_ = 0;
};

// Runs gemm on the GPU and the CPU for one case and checks the relative error.
void check_gemm(DType dt, const Dims& d, int64_t batch, bool ta, bool tb, double alpha, double beta,
                Generator& gen, bool tf32 = false) {
  const std::string what = label(dt, d, batch, ta, tb) + " alpha " + std::to_string(alpha) +
                           " beta " + std::to_string(beta) + (tf32 ? " tf32" : "");
  const Tensor a = random_tensor(ta ? mat(batch, d.k, d.m) : mat(batch, d.m, d.k), dt, gen);
  const Tensor b = random_tensor(tb ? mat(batch, d.n, d.k) : mat(batch, d.k, d.n), dt, gen);
  const Shape c_shape = mat(batch, d.m, d.n);
  const Tensor c0 = random_tensor(c_shape, dt, gen);
  Tensor want = c0.to(ref_dtype(dt)).clone();  // never aliasing c0, which the GPU copy reads
  kernels::call_kernel<kernels::gemm_k>(a.to(ref_dtype(dt)), b.to(ref_dtype(dt)), want, ta, tb,
                                        alpha, beta);
  // beta == 0: c must not be read, so it starts as NaN.
  Tensor got = beta == 0.0 ? poisoned_cuda(c_shape, dt) : c0.to(Device::cuda());
  {
    kernels::AllowTf32Guard guard(tf32);
    kernels::call_kernel<kernels::gemm_k>(a.to(Device::cuda()), b.to(Device::cuda()), got, ta, tb,
                                          alpha, beta);
  }
  EXPECT_LT(rel_error(want, got), tolerance(dt, tf32)) << what;
}

const std::vector<Dims> kOddDims = {
    {1, 1, 1},      {3, 17, 65},   {17, 65, 3},      {65, 3, 17},  {129, 1000, 1}, {1000, 129, 17},
    {1, 1000, 129}, {1000, 1, 65}, {129, 129, 1000}, {3, 1, 1000}, {17, 129, 129}};

TEST_F(CudaGemmTest, EveryTransposeFormAndOddSizesMatchCpu) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Dims& d : kOddDims) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) check_gemm(dt, d, 0, ta, tb, 1.0, 0.0, gen);
      }
    }
  }
}

TEST_F(CudaGemmTest, BatchedFormsMatchCpu) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    for (const Dims& d : {Dims{17, 65, 129}, Dims{1, 3, 1000}, Dims{65, 64, 64}}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) check_gemm(dt, d, 3, ta, tb, 1.0, 0.0, gen);
      }
    }
  }
}

TEST_F(CudaGemmTest, AlphaBetaWithRandomC) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    check_gemm(dt, {65, 129, 17}, 0, false, true, 1.5, -0.75, gen);
    check_gemm(dt, {17, 1000, 3}, 0, true, false, -0.5, 1.0, gen);
    check_gemm(dt, {3, 17, 65}, 2, true, true, 2.0, 0.25, gen);
  }
}

TEST_F(CudaGemmTest, Gpt2ShapesMatchCpu) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  // (B·T, C) · (3072, C)ᵀ and the two backward forms of the MLP's first Linear.
  const std::vector<std::pair<Dims, std::pair<bool, bool>>> cases = {
      {{1024, 3072, 768}, {false, true}},
      {{1024, 768, 3072}, {false, false}},
      {{3072, 768, 1024}, {true, false}}};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const auto& [d, flags] : cases)
      check_gemm(dt, d, 0, flags.first, flags.second, 1.0, 0.0, gen);
  }
  check_gemm(DType::kF32, {1024, 3072, 768}, 0, false, true, 1.0, 0.0, gen, /*tf32=*/true);
}

TEST_F(CudaGemmTest, Tf32OnlyUnderTheGuard) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  EXPECT_FALSE(kernels::tf32_allowed());
  check_gemm(DType::kF32, {129, 1000, 65}, 0, true, false, 1.0, 0.0, gen, /*tf32=*/true);
  EXPECT_FALSE(kernels::tf32_allowed());
  // After a TF32 GEMM of the same shape, the exact path is used again (the plan cache keys the
  // compute type).
  check_gemm(DType::kF32, {129, 1000, 65}, 0, true, false, 1.0, 0.0, gen);
}

TEST_F(CudaGemmTest, StridedAndMisalignedOperands) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF64}) {
    // a: rows of a wider matrix starting one element in (4- or 2-byte aligned, row stride 70).
    const Tensor wide_a = random_tensor({33, 70}, dt, gen);
    const Tensor wide_b = random_tensor({65, 40}, dt, gen);
    const Tensor a = wide_a.narrow(1, 1, 65);  // (33, 65), stride 70
    const Tensor b = wide_b.narrow(1, 3, 31);  // (65, 31), stride 40
    Tensor want = Tensor::empty({33, 31}, ref_dtype(dt));
    kernels::call_kernel<kernels::gemm_k>(a.to(ref_dtype(dt)).contiguous(),
                                          b.to(ref_dtype(dt)).contiguous(), want, false, false, 1.0,
                                          0.0);
    const Tensor ga = wide_a.to(Device::cuda()).narrow(1, 1, 65);
    const Tensor gb = wide_b.to(Device::cuda()).narrow(1, 3, 31);
    Tensor got = poisoned_cuda({33, 31}, dt);
    kernels::call_kernel<kernels::gemm_k>(ga, gb, got, false, false, 1.0, 0.0);
    EXPECT_LT(rel_error(want, got), tolerance(dt, false)) << dtype_name(dt);
  }
}

TEST_F(CudaGemmTest, Bf16InputsWithF32Output) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  const Tensor a = random_tensor({65, 129}, DType::kBF16, gen);
  const Tensor b = random_tensor({1000, 129}, DType::kBF16, gen);
  Tensor want = Tensor::empty({65, 1000}, DType::kF32);
  kernels::call_kernel<kernels::gemm_k>(a.to(DType::kF32), b.to(DType::kF32), want, false, true,
                                        1.0, 0.0);
  Tensor got = poisoned_cuda({65, 1000}, DType::kF32);
  kernels::call_kernel<kernels::gemm_k>(a.to(Device::cuda()), b.to(Device::cuda()), got, false,
                                        true, 1.0, 0.0);
  // f32 accumulation of exact products of bf16 values: close to the f32 reference.
  EXPECT_LT(rel_error(want, got), 1e-5);
}

// ---- fused epilogues ----

void check_epilogue(DType dt, const Dims& d, bool ta, bool tb, Generator& gen) {
  const std::string what = label(dt, d, 0, ta, tb);
  const DType rd = ref_dtype(dt);
  const Tensor a = random_tensor(ta ? Shape{d.k, d.m} : Shape{d.m, d.k}, dt, gen);
  const Tensor b = random_tensor(tb ? Shape{d.n, d.k} : Shape{d.k, d.n}, dt, gen);
  const Tensor bias = random_tensor({d.n}, dt, gen);
  Tensor want_c = Tensor::empty({d.m, d.n}, rd);
  Tensor want_pre = Tensor::empty({d.m, d.n}, rd);
  Tensor want_gelu = Tensor::empty({d.m, d.n}, rd);
  kernels::call_kernel<kernels::gemm_bias_k>(a.to(rd), b.to(rd), bias.to(rd), want_c, ta, tb);
  kernels::call_kernel<kernels::gemm_bias_gelu_k>(a.to(rd), b.to(rd), bias.to(rd), want_pre,
                                                  want_gelu, ta, tb);
  const Tensor ga = a.to(Device::cuda()), gb = b.to(Device::cuda()),
               gbias = bias.to(Device::cuda());
  Tensor got_c = poisoned_cuda({d.m, d.n}, dt);
  Tensor got_pre = poisoned_cuda({d.m, d.n}, dt);
  Tensor got_gelu = poisoned_cuda({d.m, d.n}, dt);
  kernels::call_kernel<kernels::gemm_bias_k>(ga, gb, gbias, got_c, ta, tb);
  kernels::call_kernel<kernels::gemm_bias_gelu_k>(ga, gb, gbias, got_pre, got_gelu, ta, tb);
  const double tol = tolerance(dt, false);
  EXPECT_LT(output_error(want_c, got_c, dt), tol) << "gemm_bias " << what;
  EXPECT_LT(output_error(want_pre, got_pre, dt), tol) << "gemm_bias_gelu pre " << what;
  EXPECT_LT(output_error(want_gelu, got_gelu, dt), tol) << "gemm_bias_gelu out " << what;
}

TEST_F(CudaGemmTest, BiasAndBiasGeluEpiloguesMatchCpu) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  // N = 17 and 1 cannot take the fused GELU epilogue (aux ld % 8); 1000 and 3072 can.
  const std::vector<Dims> dims = {
      {3, 17, 65}, {65, 1000, 129}, {1, 1, 1}, {1000, 1, 17}, {1024, 3072, 768}};
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Dims& d : dims) {
      if (dt == DType::kF64 && d.m * d.n * d.k > 1e8) continue;  // keep the f64 case quick
      check_epilogue(dt, d, false, true, gen);                   // the Linear form
    }
    check_epilogue(dt, {17, 64, 33}, true, false, gen);
    check_epilogue(dt, {33, 24, 17}, false, false, gen);
  }
}

// gemm_dgelu_bgrad on one case: dpre and dbias against the CPU kernel, both outputs poisoned.
void check_dgelu_bgrad(DType dt, const Dims& d, bool ta, bool tb, Generator& gen) {
  const std::string what = label(dt, d, 0, ta, tb);
  const DType rd = ref_dtype(dt);
  const Tensor a = random_tensor(ta ? Shape{d.k, d.m} : Shape{d.m, d.k}, dt, gen);
  const Tensor b = random_tensor(tb ? Shape{d.n, d.k} : Shape{d.k, d.n}, dt, gen);
  const Tensor pre = random_tensor({d.m, d.n}, dt, gen);  // N(0, 3): both tails of gelu'
  Tensor want_dpre = Tensor::empty({d.m, d.n}, rd);
  Tensor want_dbias = Tensor::empty({d.n}, rd);
  kernels::call_kernel<kernels::gemm_dgelu_bgrad_k>(a.to(rd), b.to(rd), pre.to(rd), want_dpre,
                                                    want_dbias, ta, tb);
  Tensor got_dpre = poisoned_cuda({d.m, d.n}, dt);
  Tensor got_dbias = poisoned_cuda({d.n}, dt);
  kernels::call_kernel<kernels::gemm_dgelu_bgrad_k>(a.to(Device::cuda()), b.to(Device::cuda()),
                                                    pre.to(Device::cuda()), got_dpre, got_dbias, ta,
                                                    tb);
  const double tol = tolerance(dt, false);
  EXPECT_LT(output_error(want_dpre, got_dpre, dt), tol) << "gemm_dgelu_bgrad dpre " << what;
  EXPECT_LT(output_error(want_dbias, got_dbias, dt), tol) << "gemm_dgelu_bgrad dbias " << what;
}

TEST_F(CudaGemmTest, DgeluBgradEpilogueMatchesCpu) {
  // Tolerances as above: f64 1e-12, f32 1e-5, bf16/f16 1e-2 (the reference in f32 on the
  // upcast values), for dpre and for dbias alike.
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  // N = 17 and 1 cannot take the fused epilogue (aux ld % 8); 24, 1000 and 3072 can. K = 0:
  // dpre and dbias are zeros.
  const std::vector<Dims> dims = {{3, 17, 65},   {65, 1000, 129}, {1, 1, 1},
                                  {1000, 1, 17}, {33, 24, 17},    {5, 16, 0}};
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Dims& d : dims) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) check_dgelu_bgrad(dt, d, ta, tb, gen);
      }
    }
  }
  // The GPT-2 MLP: dh (B·T, 4C) = dy (B·T, C) · w_proj (C, 4C), as the fc Linear's backward
  // uses it, at B·T = 2048, C = 768.
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    check_dgelu_bgrad(dt, {2048, 3072, 768}, false, false, gen);
  }
}

TEST_F(CudaGemmTest, ZeroInnerDimension) {
  // K = 0: c = beta·c (gemm) and c = bias rows (gemm_bias).
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  const Tensor a = Tensor::empty({5, 0}), b = Tensor::empty({0, 7});
  const Tensor c0 = random_tensor({5, 7}, DType::kF32, gen);
  Tensor want = c0.clone();
  kernels::call_kernel<kernels::gemm_k>(a, b, want, false, false, 1.0, 0.5);
  Tensor got = c0.to(Device::cuda());
  kernels::call_kernel<kernels::gemm_k>(a.to(Device::cuda()), b.to(Device::cuda()), got, false,
                                        false, 1.0, 0.5);
  EXPECT_LT(rel_error(want, got), 1e-6);
  const Tensor bias = random_tensor({7}, DType::kF32, gen);
  Tensor want_b = Tensor::empty({5, 7});
  kernels::call_kernel<kernels::gemm_bias_k>(a, b, bias, want_b, false, false);
  Tensor got_b = poisoned_cuda({5, 7}, DType::kF32);
  kernels::call_kernel<kernels::gemm_bias_k>(a.to(Device::cuda()), b.to(Device::cuda()),
                                             bias.to(Device::cuda()), got_b, false, false);
  EXPECT_LT(rel_error(want_b, got_b), 1e-6);
}

}  // namespace
}  // namespace loom
