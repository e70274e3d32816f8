// tests/cuda/softmax_kernel_test.cpp — the CUDA softmax kernels (kernels/cuda/softmax.cu)
// against the CPU kernels: fresh random inputs each run (the seed is printed on failure), outputs
// poisoned, dx accumulator random, odd N and C up to a vocabulary-sized row (too long for the
// shared-memory row cache), misaligned rows. f32/f64 are compared with the CPU kernel on the same
// values; bf16/f16 with the CPU kernel on the values widened to f32. Tolerances, as relative
// errors (DESIGN §3): f32 1e-5, f64 1e-12, bf16/f16 1e-2. Skips without a GPU.
#include <random>
#include <string>

#include "kernels/softmax.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using CudaSoftmaxTest = CudaTest;

void run_case(DType dt, const Shape& shape, Generator& gen, bool misalign = false) {
  const std::string what =
      std::string(dtype_name(dt)) + " " + shape_str(shape) + (misalign ? " misaligned" : "");
  SCOPED_TRACE(what);
  const Tensor x = random_tensor(shape, dt, gen);
  const Tensor gx = to_gpu(x, misalign);
  Tensor gy = to_gpu(Tensor::full(shape, std::numeric_limits<double>::quiet_NaN(), dt), misalign);
  kernels::call_kernel<kernels::softmax_forward_k>(gx, gy);
  const Tensor rx = to_ref(x);
  Tensor ry = Tensor::empty(shape, rx.dtype());
  kernels::call_kernel<kernels::softmax_forward_k>(rx, ry);
  EXPECT_LT(rel_error(ry, gy), tol(dt)) << "y";

  // Backward at the CPU's y (rounded to dt for the GPU), accumulating into a random dx.
  const Tensor y = ry.to(dt), dy = random_tensor(shape, dt, gen),
               dx0 = random_tensor(shape, dt, gen);
  const Tensor ref_y = to_ref(y);
  Tensor rdx = to_ref(dx0);
  kernels::call_kernel<kernels::softmax_backward_k>(ref_y, to_ref(dy), rdx);
  Tensor gdx = to_gpu(dx0, misalign);
  kernels::call_kernel<kernels::softmax_backward_k>(to_gpu(y, misalign), to_gpu(dy, misalign), gdx);
  EXPECT_LT(rel_error(rdx, gdx), tol(dt)) << "dx";
}

TEST_F(CudaSoftmaxTest, MatchesCpuAtOddSizes) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  for (DType dt : kFloatDTypes) {
    for (int64_t n : {1, 3, 17, 65}) {
      for (int64_t c : {1, 3, 17, 65, 769, 1600, 4099}) run_case(dt, {n, c}, gen);
    }
    run_case(dt, {2, 3, 5, 1024}, gen);  // more than two dims: rows are all but the last
  }
}

// 50257 (GPT-2's vocabulary): f32/bf16 rows exceed the shared-memory row cache and are re-read.
TEST_F(CudaSoftmaxTest, LongRowsMatchCpu) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  for (DType dt : kFloatDTypes) {
    run_case(dt, {3, 50257}, gen);
    run_case(dt, {2, 8192}, gen);
    run_case(dt, {1031, 64}, gen);
    // Dynamic shared memory just under 48 KiB beside the static scratch (the opt-in's edge,
    // kernels/cuda/row_io.cuh): f32 forward at 12288, backward at 6144; f64 at half.
    for (int64_t c : {int64_t{3072}, int64_t{6144}, int64_t{12288}}) run_case(dt, {2, c}, gen);
  }
}

TEST_F(CudaSoftmaxTest, MisalignedRowsMatchCpu) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  for (DType dt : kFloatDTypes) run_case(dt, {17, 1600}, gen, true);
}

}  // namespace
}  // namespace loom
