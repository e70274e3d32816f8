// tests/cuda/rope_kernel_test.cpp — the CUDA rotary embedding kernels (kernels/cuda/rope.cu)
// against the CPU kernels: fresh random inputs each run (the seed is printed on failure), output
// poisoned, dx accumulator random, odd T, several heads, head dims whose half is and is not a
// multiple of the 16-byte pack, positions that do not start at 0 (and are not contiguous), every
// position dtype. f32/f64 are compared with the CPU kernel on the same values; bf16/f16 with the
// CPU kernel on the values widened to f32. Tolerances, as relative errors (DESIGN §3): f32 1e-5,
// f64 1e-12, bf16/f16 1e-2. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/rope.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using CudaRopeTest = CudaTest;

// positions (T): first + t·stride, or (when scattered) increasing random gaps from `first`.
Tensor make_positions(int64_t t_len, int64_t first, bool scattered, DType pdt, Generator& gen) {
  std::vector<double> pos(static_cast<size_t>(t_len));
  const std::vector<double> gaps = randint({std::max<int64_t>(t_len, 1)}, 1, 40, gen).to_vector();
  double p = static_cast<double>(first);
  for (int64_t t = 0; t < t_len; ++t) {
    pos[static_cast<size_t>(t)] = p;
    p += scattered ? gaps[static_cast<size_t>(t)] : 1.0;
  }
  return Tensor::from_vector(pos, {t_len}).to(pdt);
}

// theta > 0: the plain RoPE; theta < 0: a scaled one of base −theta (every other frequency
// divided by 8, as Llama 3's low frequencies are, and the cos/sin scaled by 1.2, as YaRN's).
void run_case(DType dt, const Shape& shape, const Tensor& positions, double theta, Generator& gen) {
  const std::string what = std::string(dtype_name(dt)) + " " + shape_str(shape) + " positions " +
                           dtype_name(positions.dtype()) + " from " +
                           std::to_string(positions.to(DType::kF64).to_vector().at(0)) + " theta " +
                           std::to_string(theta);
  kernels::RopeFrequencies f = kernels::RopeFrequencies::plain(std::abs(theta), shape[3]);
  if (theta < 0) {
    for (size_t i = 0; i < f.inv_freq.size(); i += 2) f.inv_freq[i] /= 8;
    f.scale = 1.2;
  }
  SCOPED_TRACE(what);
  const Tensor x = random_tensor(shape, dt, gen), dy = random_tensor(shape, dt, gen);
  const Tensor dx0 = random_tensor(shape, dt, gen);
  const Tensor gpos = positions.to(Device::cuda());

  Tensor gy = poisoned_cuda(shape, dt);
  kernels::call_kernel<kernels::rope_forward_k>(x.to(Device::cuda()), gpos, f, gy);
  Tensor ry = Tensor::empty(shape, to_ref(x).dtype());
  kernels::call_kernel<kernels::rope_forward_k>(to_ref(x), positions, f, ry);
  EXPECT_LT(rel_error(ry, gy), tol(dt)) << "y";

  Tensor gdx = dx0.to(Device::cuda());
  kernels::call_kernel<kernels::rope_backward_k>(dy.to(Device::cuda()), gpos, f, gdx);
  Tensor rdx = to_ref(dx0);
  kernels::call_kernel<kernels::rope_backward_k>(to_ref(dy), positions, f, rdx);
  EXPECT_LT(rel_error(rdx, gdx), tol(dt)) << "dx";
}

TEST_F(CudaRopeTest, MatchesCpuAtOddSizesAndOffsetPositions) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  // (B, T, H, D): half = 32 and 64 (packed), 3 and 1 (one element at a time), 12 (f32/f64
  // packed, bf16/f16 not).
  const std::vector<Shape> shapes = {{2, 17, 3, 64}, {1, 33, 5, 128}, {3, 7, 2, 6},
                                     {1, 1, 1, 2},   {2, 5, 4, 24},   {1, 129, 2, 128}};
  for (DType dt : kFloatDTypes) {
    for (const Shape& s : shapes) {
      run_case(dt, s, make_positions(s[1], 517, false, DType::kI64, gen), 10000.0, gen);
      run_case(dt, s, make_positions(s[1], 3, true, DType::kI32, gen), 500000.0, gen);
      run_case(dt, s, make_positions(s[1], 9000, false, DType::kI32, gen), -500000.0, gen);
    }
  }
}

TEST_F(CudaRopeTest, EveryPositionDTypeMatchesCpu) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  for (DType pdt : {DType::kI32, DType::kI64, DType::kU16, DType::kU32}) {
    run_case(DType::kF32, {2, 9, 3, 64}, make_positions(9, 40000, true, pdt, gen), 10000.0, gen);
  }
}

}  // namespace
}  // namespace loom
