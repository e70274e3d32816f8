// tests/cuda/elementwise_kernel_test.cpp — the CUDA binary_forward, scale_forward and axpy
// kernels against the CPU kernels on fresh random inputs: every float dtype, odd sizes, the
// contiguous, row-broadcast, strided and misaligned (offset-by-one view) paths. Outputs are
// poisoned first; axpy starts from a random accumulator. Tolerances per dtype: tolerance() in
// tests/cuda/cpu_reference.h (f32 1e-6, f64 1e-12, bf16 1e-2, f16 2e-3). Skips without a GPU.
#include "kernels/elementwise.h"
#include "tests/cuda/cpu_reference.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using kernels::BinaryOp;
using CudaElementwiseTest = CudaTest;

const BinaryOp kOps[] = {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv};

std::string op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "add";
    case BinaryOp::kSub:
      return "sub";
    case BinaryOp::kMul:
      return "mul";
    case BinaryOp::kDiv:
      return "div";
  }
  return "?";
}

// Denominators in [0.5, 3): a quotient then fits f16 (randn values over tiny divisors would not).
Pair divisor_pair(const Shape& shape, DType dt, Generator& gen) {
  const Tensor x = rand(shape, gen, DType::kF64, 0.5, 3.0).to(dt);
  return {x.to(reference_dtype(dt)), x.to(Device::cuda())};
}

// Runs binary_forward on the GPU operands (views as given) and on their CPU twins; compares.
void check_binary(BinaryOp op, const Tensor& a_cpu, const Tensor& b_cpu, const Tensor& a_gpu,
                  const Tensor& b_gpu, DType dt, const std::string& what) {
  Tensor out = poisoned_cuda(a_gpu.shape(), dt);
  kernels::call_kernel<kernels::binary_forward_k>(op, a_gpu, b_gpu, out);
  Tensor want = Tensor::empty(a_cpu.shape(), a_cpu.dtype());
  kernels::call_kernel<kernels::binary_forward_k>(op, a_cpu, b_cpu, want);
  expect_close(want, out, dt, what + " " + op_name(op));
}

TEST_F(CudaElementwiseTest, BinaryContiguousMatchesCpu) {
  Generator gen(101);
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      const Pair a = random_pair({n}, dt, gen), b = random_pair({n}, dt, gen);
      const Pair d = divisor_pair({n}, dt, gen);
      for (BinaryOp op : kOps) {
        const Pair& rhs = op == BinaryOp::kDiv ? d : b;
        check_binary(op, a.cpu, rhs.cpu, a.gpu, rhs.gpu, dt, label("binary", dt, n));
      }
    }
  }
}

TEST_F(CudaElementwiseTest, BinaryRowBroadcastStridedAndMisalignedMatchCpu) {
  Generator gen(102);
  for (DType dt : kFloatDTypes) {
    const Shape shape = {5, 7, 33};
    const Pair a = random_pair(shape, dt, gen);
    // b a bias row (stride 0 in the leading dims): the row-broadcast path.
    const Pair row = divisor_pair({33}, dt, gen);
    for (BinaryOp op : kOps) {
      check_binary(op, a.cpu, row.cpu.expand(shape), a.gpu, row.gpu.expand(shape), dt,
                   std::string("row broadcast ") + dtype_name(dt));
    }
    // b broadcast along the middle dim, a transposed: the general strided path.
    const Pair mid = divisor_pair({5, 1, 33}, dt, gen);
    const Pair at = random_pair({33, 7, 5}, dt, gen);
    for (BinaryOp op : kOps) {
      check_binary(op, at.cpu.permute({2, 1, 0}), mid.cpu.expand(shape), at.gpu.permute({2, 1, 0}),
                   mid.gpu.expand(shape), dt, std::string("strided ") + dtype_name(dt));
    }
    // Contiguous views that start one element in: unaligned for 16-byte packs.
    const int64_t n = 100003;
    const Pair x = random_pair({n + 1}, dt, gen), y = divisor_pair({n + 1}, dt, gen);
    for (BinaryOp op : kOps) {
      check_binary(op, x.cpu.narrow(0, 1, n), y.cpu.narrow(0, 1, n), x.gpu.narrow(0, 1, n),
                   y.gpu.narrow(0, 1, n), dt, std::string("misaligned ") + dtype_name(dt));
    }
  }
}

TEST_F(CudaElementwiseTest, ScaleMatchesCpu) {
  Generator gen(103);
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      const Pair x = random_pair({n}, dt, gen);
      Tensor out = poisoned_cuda({n}, dt);
      kernels::call_kernel<kernels::scale_forward_k>(x.gpu, -1.7, out);
      Tensor want = Tensor::empty({n}, x.cpu.dtype());
      kernels::call_kernel<kernels::scale_forward_k>(x.cpu, -1.7, want);
      expect_close(want, out, dt, label("scale", dt, n));
    }
    const Pair m = random_pair({17, 65}, dt, gen);
    Tensor out = poisoned_cuda({65, 17}, dt);
    kernels::call_kernel<kernels::scale_forward_k>(m.gpu.transpose(0, 1), 0.37, out);
    Tensor want = Tensor::empty({65, 17}, m.cpu.dtype());
    kernels::call_kernel<kernels::scale_forward_k>(m.cpu.transpose(0, 1), 0.37, want);
    expect_close(want, out, dt, std::string("scale transposed ") + dtype_name(dt));
  }
}

TEST_F(CudaElementwiseTest, AxpyAccumulatesLikeCpu) {
  Generator gen(104);
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      const Pair x = random_pair({n}, dt, gen), y = random_pair({n}, dt, gen);
      Tensor got = y.gpu.clone();
      kernels::call_kernel<kernels::axpy_k>(0.75, x.gpu, got);
      Tensor want = y.cpu.clone();
      kernels::call_kernel<kernels::axpy_k>(0.75, x.cpu, want);
      expect_close(want, got, dt, label("axpy", dt, n));
    }
    const Pair x = random_pair({3, 17, 5}, dt, gen), y = random_pair({5, 17, 3}, dt, gen);
    Tensor got = y.gpu.clone();
    kernels::call_kernel<kernels::axpy_k>(-2.5, x.gpu.permute({2, 1, 0}), got);
    Tensor want = y.cpu.clone();
    kernels::call_kernel<kernels::axpy_k>(-2.5, x.cpu.permute({2, 1, 0}), want);
    expect_close(want, got, dt, std::string("axpy strided ") + dtype_name(dt));
  }
}

TEST_F(CudaElementwiseTest, RejectsIntegerDTypes) {
  const Tensor a = Tensor::ones({4}, DType::kI32, Device::cuda());
  Tensor out = Tensor::empty({4}, DType::kI32, Device::cuda());
  try {
    kernels::call_kernel<kernels::binary_forward_k>(BinaryOp::kAdd, a, a, out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("binary_forward: dtype i32 not supported"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom
