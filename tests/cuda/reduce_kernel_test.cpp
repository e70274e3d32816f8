// tests/cuda/reduce_kernel_test.cpp — the CUDA sum_dim_forward, sum_squares_forward and
// clip_factor_forward kernels against the CPU kernels on fresh random inputs (every float dtype;
// row sums, column sums, odd sizes, sizes spanning several chunks), outputs poisoned first, and
// run twice to check that the bits repeat (the kernels use no float atomics); the clipping factor
// bit for bit. Tolerances: sum_dim per dtype as in tests/cuda/cpu_reference.h; sum_squares 1e-12
// (both sum in double, in different orders). Skips without a GPU.
#include <array>
#include <cmath>
#include <limits>

#include "kernels/reduce.h"
#include "tests/cuda/cpu_reference.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using CudaReduceTest = CudaTest;

TEST_F(CudaReduceTest, SumDimMatchesCpuAndRepeats) {
  Generator gen(201);
  // (outer, n, inner): row sums (inner 1) within one chunk and over many; column sums with one
  // and several row chunks; a reduced dim of 1.
  const std::vector<std::array<int64_t, 3>> cases = {{1, 1, 1},   {3, 17, 1},    {1, 1000003, 1},
                                                     {65, 3, 17}, {2, 1000, 65}, {1, 8193, 3},
                                                     {17, 1, 65}, {4, 65, 1000}, {1, 3, 1000003}};
  for (DType dt : kFloatDTypes) {
    for (const auto& [outer, n, inner] : cases) {
      const std::string what = std::string("sum_dim ") + dtype_name(dt) + " (" +
                               std::to_string(outer) + ", " + std::to_string(n) + ", " +
                               std::to_string(inner) + ")";
      const Pair x = random_pair({outer, n, inner}, dt, gen);
      Tensor got = poisoned_cuda({outer, inner}, dt);
      kernels::call_kernel<kernels::sum_dim_forward_k>(x.gpu, outer, n, inner, got);
      Tensor want = Tensor::empty({outer, inner}, x.cpu.dtype());
      kernels::call_kernel<kernels::sum_dim_forward_k>(x.cpu, outer, n, inner, want);
      expect_close(want, got, dt, what);
      Tensor again = poisoned_cuda({outer, inner}, dt);
      kernels::call_kernel<kernels::sum_dim_forward_k>(x.gpu, outer, n, inner, again);
      expect_same_bits(got.to(Device::cpu()), again, what + " (repeat)");
    }
  }
}

TEST_F(CudaReduceTest, SumSquaresMatchesCpuAndRepeats) {
  Generator gen(202);
  std::vector<int64_t> sizes = kOddSizes;
  sizes.push_back(8192 * 3 + 1);  // just past a chunk boundary
  for (DType dt : kFloatDTypes) {
    for (int64_t n : sizes) {
      const Pair x = random_pair({n}, dt, gen);
      Tensor got = poisoned_cuda({}, DType::kF64);
      kernels::call_kernel<kernels::sum_squares_forward_k>(x.gpu, got);
      Tensor want = Tensor::empty({}, DType::kF64);
      kernels::call_kernel<kernels::sum_squares_forward_k>(x.cpu, want);
      const double err = rel_error(want, got);
      EXPECT_LE(err, 1e-12) << label("sum_squares", dt, n) << ": relative error " << err;
      Tensor again = poisoned_cuda({}, DType::kF64);
      kernels::call_kernel<kernels::sum_squares_forward_k>(x.gpu, again);
      expect_same_bits(got.to(Device::cpu()), again, label("sum_squares repeat", dt, n));
    }
    // A non-zero offset (unaligned start) and a 2-d tensor.
    const Pair m = random_pair({65, 17}, dt, gen);
    Tensor got = poisoned_cuda({}, DType::kF64);
    kernels::call_kernel<kernels::sum_squares_forward_k>(m.gpu.narrow(0, 1, 64), got);
    Tensor want = Tensor::empty({}, DType::kF64);
    kernels::call_kernel<kernels::sum_squares_forward_k>(m.cpu.narrow(0, 1, 64), want);
    EXPECT_LE(rel_error(want, got), 1e-12) << "sum_squares narrowed " << dtype_name(dt);
  }
}

// The clipping factor from a sum of squares (kernels::clip_factor on the device): the CPU
// kernel's bits (both take a correctly rounded sqrt and division), for norms below, at and above
// max_norm, 0, inf and NaN; the output poisoned first.
TEST_F(CudaReduceTest, ClipFactorMatchesCpu) {
  Generator gen(203);
  std::vector<double> sums = {0.0, 2.25, 1e300, std::numeric_limits<double>::infinity(),
                              std::nan("")};
  const Tensor r = rand({6}, gen, DType::kF64, 0.0, 10.0);
  for (double v : r.to_vector()) sums.push_back(v);
  for (const double sq : sums) {
    const Tensor sum_cpu = Tensor::scalar(sq, DType::kF64);
    Tensor got = poisoned_cuda({}, DType::kF64);
    kernels::call_kernel<kernels::clip_factor_forward_k>(sum_cpu.to(Device::cuda()), 1.5, got);
    Tensor want = Tensor::empty({}, DType::kF64);
    kernels::call_kernel<kernels::clip_factor_forward_k>(sum_cpu, 1.5, want);
    expect_same_bits(want, got, "clip_factor of " + std::to_string(sq));
  }
}

// The loss-scaling step (kernels/reduce.h loss_scale_step) on the device: the same factor bits
// and the same state as the CPU kernel, step by step through finite norms (clipping engaged and
// not), inf, NaN and growth after the interval (3 here); the factor poisoned first.
TEST_F(CudaReduceTest, LossScaleStepMatchesCpu) {
  Generator gen(204);
  std::vector<double> sums = {
      4.0, 1e6, std::numeric_limits<double>::infinity(), std::nan(""), 2.0, 3.0, 5.0, 0.0};
  for (double v : rand({5}, gen, DType::kF64, 0.0, 1e4).to_vector()) sums.push_back(v);
  const Tensor init = Tensor::from_vector(std::vector<double>{1024.0, 0.0, 0.0}, {3});
  Tensor state_cpu = init.clone(), state_gpu = init.to(Device::cuda());
  for (const double sq : sums) {
    Tensor got = poisoned_cuda({}, DType::kF64), want = Tensor::empty({}, DType::kF64);
    kernels::call_kernel<kernels::loss_scale_step_k>(
        Tensor::scalar(sq, DType::kF64, Device::cuda()), state_gpu, 1.5, int64_t{3}, got);
    kernels::call_kernel<kernels::loss_scale_step_k>(Tensor::scalar(sq, DType::kF64), state_cpu,
                                                     1.5, int64_t{3}, want);
    expect_same_bits(want, got, "loss_scale_step factor of " + std::to_string(sq));
    expect_same_bits(state_cpu, state_gpu, "loss_scale_step state after " + std::to_string(sq));
  }
}

}  // namespace
}  // namespace loom
