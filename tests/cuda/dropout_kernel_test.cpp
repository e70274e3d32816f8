// tests/cuda/dropout_kernel_test.cpp — the CUDA dropout kernels reproduce the CPU kernels'
// Note [Dropout mask] bit for bit: f32/f64 outputs equal the CPU's exactly (forward, and backward
// accumulating into a random gradient), for several (p, seed, offset), odd sizes and a
// misaligned view; bf16/f16 drop exactly the elements the CPU drops (on the same values in f32)
// and keep the rest within tolerance() of tests/cuda/cpu_reference.h. The rows form (sequence/
// context parallelism) is checked the same way against the CPU rows kernels, with row sets in
// and out of order and row lengths C both odd and a multiple of 4. Skips without a GPU.
#include "kernels/dropout.h"
#include "tests/cuda/cpu_reference.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using CudaDropoutTest = CudaTest;

struct Draw {
  double p;
  uint64_t seed, offset;
};
const Draw kDraws[] = {
    {0.1, 1234, 0}, {0.5, 99, 7}, {0.9, 0xdeadbeefcafeULL, 123457}, {0.0, 5, 3}, {1.0, 6, 1}};

// The elements that are zero in `t` (host copy), as a bit vector.
std::vector<bool> zeros_of(const Tensor& t) {
  const std::vector<double> v = t.to(Device::cpu()).contiguous().to_vector();
  std::vector<bool> z(v.size());
  for (size_t i = 0; i < v.size(); ++i) z[i] = v[i] == 0.0;
  return z;
}

TEST_F(CudaDropoutTest, ForwardMatchesCpuBitForBit) {
  Generator gen(401);
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      for (bool misaligned : {false, true}) {
        const Pair base = random_pair({n + 1}, dt, gen);
        const int64_t start = misaligned ? 1 : 0;
        const Tensor x_cpu = base.cpu.narrow(0, start, n), x_gpu = base.gpu.narrow(0, start, n);
        for (const Draw& d : kDraws) {
          const std::string what = label("dropout_forward", dt, n) + " p=" + std::to_string(d.p) +
                                   (misaligned ? " misaligned" : "");
          Tensor y = poisoned_cuda({n}, dt);
          kernels::call_kernel<kernels::dropout_forward_k>(x_gpu, d.p, d.seed, d.offset, y);
          Tensor want = Tensor::empty({n}, x_cpu.dtype());
          kernels::call_kernel<kernels::dropout_forward_k>(x_cpu, d.p, d.seed, d.offset, want);
          if (reference_dtype(dt) == dt) {
            expect_same_bits(want, y, what);
          } else {
            EXPECT_EQ(zeros_of(want), zeros_of(y)) << what << ": masks differ";
            expect_close(want, y, dt, what);
          }
        }
      }
    }
  }
}

TEST_F(CudaDropoutTest, BackwardAccumulatesWithTheSameMask) {
  Generator gen(402);
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      for (const Draw& d : kDraws) {
        const std::string what = label("dropout_backward", dt, n) + " p=" + std::to_string(d.p);
        const Pair dy = random_pair({n}, dt, gen);
        const Pair dx = random_pair({n}, dt, gen);
        Tensor got = dx.gpu.clone();
        kernels::call_kernel<kernels::dropout_backward_k>(dy.gpu, d.p, d.seed, d.offset, got);
        Tensor want = dx.cpu.clone();
        kernels::call_kernel<kernels::dropout_backward_k>(dy.cpu, d.p, d.seed, d.offset, want);
        if (reference_dtype(dt) == dt) {
          expect_same_bits(want, got, what);
        } else {
          expect_close(want, got, dt, what);
        }
      }
    }
  }
}

TEST_F(CudaDropoutTest, DropsAboutAFractionP) {
  Generator gen(403);
  const int64_t n = 1000003;
  const Tensor x = rand({n}, gen, DType::kF32, 1.0, 2.0, Device::cuda());  // never zero
  Tensor y = poisoned_cuda({n}, DType::kF32);
  kernels::call_kernel<kernels::dropout_forward_k>(x, 0.3, 77, 11, y);
  int64_t dropped = 0;
  for (bool z : zeros_of(y)) dropped += z ? 1 : 0;
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(n), 0.3, 0.005);
}

// Row shapes (B, R, C) with the whole sequence length T: C odd (one Philox block per element)
// or a multiple of 4 (one per four), rows out of order, a ragged tail, and a large case.
struct RowsCase {
  Shape shape;
  int64_t total;
  std::vector<int64_t> rows;
};
const RowsCase kRowsCases[] = {{{1, 1, 1}, 1, {0}},
                               {{2, 3, 7}, 5, {4, 0, 2}},
                               {{3, 4, 8}, 8, {7, 0, 6, 1}},
                               {{2, 2, 33}, 4, {1, 2}},
                               {{2, 64, 1027}, 256, {}}};  // rows: 64 of 256, strided

std::vector<int64_t> rows_for(const RowsCase& c) {
  if (!c.rows.empty()) return c.rows;
  std::vector<int64_t> r;
  for (int64_t j = 0; j < c.shape[1]; ++j) r.push_back((j * 4 + 3) % c.total);
  return r;
}

TEST_F(CudaDropoutTest, RowsForwardAndBackwardMatchCpu) {
  Generator gen(404);
  for (DType dt : kFloatDTypes) {
    for (const RowsCase& c : kRowsCases) {
      const std::vector<int64_t> r = rows_for(c);
      const Tensor rows_cpu = Tensor::from_vector(r, {c.shape[1]});
      const Tensor rows_gpu = rows_cpu.to(Device::cuda());
      for (const Draw& d : kDraws) {
        const std::string what = label("dropout_rows", dt, shape_numel(c.shape)) + " " +
                                 shape_str(c.shape) + " p=" + std::to_string(d.p);
        const Pair x = random_pair(c.shape, dt, gen);
        Tensor y = poisoned_cuda(c.shape, dt);
        kernels::call_kernel<kernels::dropout_rows_forward_k>(x.gpu, rows_gpu, c.total, 0, d.p,
                                                              d.seed, d.offset, y);
        Tensor want = Tensor::empty(c.shape, x.cpu.dtype());
        kernels::call_kernel<kernels::dropout_rows_forward_k>(x.cpu, rows_cpu, c.total, 0, d.p,
                                                              d.seed, d.offset, want);
        const Pair dy = random_pair(c.shape, dt, gen), dx = random_pair(c.shape, dt, gen);
        Tensor got_dx = dx.gpu.clone(), want_dx = dx.cpu.clone();
        kernels::call_kernel<kernels::dropout_rows_backward_k>(dy.gpu, rows_gpu, c.total, 0, d.p,
                                                               d.seed, d.offset, got_dx);
        kernels::call_kernel<kernels::dropout_rows_backward_k>(dy.cpu, rows_cpu, c.total, 0, d.p,
                                                               d.seed, d.offset, want_dx);
        if (reference_dtype(dt) == dt) {
          expect_same_bits(want, y, what);
          expect_same_bits(want_dx, got_dx, what + " backward");
        } else {
          EXPECT_EQ(zeros_of(want), zeros_of(y)) << what << ": masks differ";
          expect_close(want, y, dt, what);
          expect_close(want_dx, got_dx, dt, what + " backward");
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom
