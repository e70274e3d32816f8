// tests/cuda/activation_kernel_test.cpp — the CUDA GELU, SiLU and SwiGLU kernels, forward and
// backward, against the CPU kernels on fresh random inputs: every float dtype (bf16/f16 against
// the CPU kernel on the same values in f32), odd sizes, a misaligned (offset-by-one) view.
// Forward outputs are poisoned first; backward gradients start from random values, since the
// kernels accumulate. Tolerances per dtype: tolerance() in tests/cuda/cpu_reference.h (f32 1e-6:
// the CUDA expf and the CPU's polynomial exp differ by a few ulp). Skips without a GPU.
#include "kernels/activation.h"
#include "tests/cuda/cpu_reference.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using CudaActivationTest = CudaTest;

// Inputs of n elements starting one element into their storage when `misaligned`.
Pair input(int64_t n, DType dt, Generator& gen, bool misaligned) {
  if (!misaligned) return random_pair({n}, dt, gen);
  const Pair p = random_pair({n + 1}, dt, gen);
  return {p.cpu.narrow(0, 1, n), p.gpu.narrow(0, 1, n)};
}

template <typename K>
void check_unary_forward(const char* name) {
  Generator gen(301);
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      for (bool mis : {false, true}) {
        const Pair x = input(n, dt, gen, mis);
        Tensor y = poisoned_cuda({n}, dt);
        kernels::call_kernel<K>(x.gpu, y);
        Tensor want = Tensor::empty({n}, x.cpu.dtype());
        kernels::call_kernel<K>(x.cpu, want);
        expect_close(want, y, dt, label(name, dt, n) + (mis ? " misaligned" : ""));
      }
    }
  }
}

template <typename K>
void check_unary_backward(const char* name) {
  Generator gen(302);
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      for (bool mis : {false, true}) {
        const Pair x = input(n, dt, gen, mis), dy = input(n, dt, gen, false);
        Pair dx = input(n, dt, gen, mis);
        kernels::call_kernel<K>(x.gpu, dy.gpu, dx.gpu);
        Tensor want = dx.cpu.clone();
        kernels::call_kernel<K>(x.cpu, dy.cpu, want);
        expect_close(want, dx.gpu, dt, label(name, dt, n) + (mis ? " misaligned" : ""));
      }
    }
  }
}

TEST_F(CudaActivationTest, GeluForwardMatchesCpu) {
  check_unary_forward<kernels::gelu_forward_k>("gelu_forward");
}
TEST_F(CudaActivationTest, GeluBackwardAccumulatesLikeCpu) {
  check_unary_backward<kernels::gelu_backward_k>("gelu_backward");
}
TEST_F(CudaActivationTest, SiluForwardMatchesCpu) {
  check_unary_forward<kernels::silu_forward_k>("silu_forward");
}
TEST_F(CudaActivationTest, SiluBackwardAccumulatesLikeCpu) {
  check_unary_backward<kernels::silu_backward_k>("silu_backward");
}

TEST_F(CudaActivationTest, SwigluForwardMatchesCpu) {
  Generator gen(303);
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      const Pair g = input(n, dt, gen, false), u = input(n, dt, gen, n > 1);
      Tensor y = poisoned_cuda({n}, dt);
      kernels::call_kernel<kernels::swiglu_forward_k>(g.gpu, u.gpu, y);
      Tensor want = Tensor::empty({n}, g.cpu.dtype());
      kernels::call_kernel<kernels::swiglu_forward_k>(g.cpu, u.cpu, want);
      expect_close(want, y, dt, label("swiglu_forward", dt, n));
    }
  }
}

TEST_F(CudaActivationTest, SwigluBackwardAccumulatesLikeCpu) {
  Generator gen(304);
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kOddSizes) {
      const Pair g = input(n, dt, gen, false), u = input(n, dt, gen, false);
      const Pair dy = input(n, dt, gen, false);
      Pair dg = input(n, dt, gen, false), du = input(n, dt, gen, true);
      kernels::call_kernel<kernels::swiglu_backward_k>(g.gpu, u.gpu, dy.gpu, dg.gpu, du.gpu);
      Tensor want_dg = dg.cpu.clone(), want_du = du.cpu.clone();
      kernels::call_kernel<kernels::swiglu_backward_k>(g.cpu, u.cpu, dy.cpu, want_dg, want_du);
      expect_close(want_dg, dg.gpu, dt, label("swiglu_backward dgate", dt, n));
      expect_close(want_du, du.gpu, dt, label("swiglu_backward dup", dt, n));
    }
  }
}

TEST_F(CudaActivationTest, RejectsMismatchedShapes) {
  const Tensor x = Tensor::ones({4}, DType::kF32, Device::cuda());
  Tensor y = Tensor::empty({5}, DType::kF32, Device::cuda());
  EXPECT_THROW(kernels::call_kernel<kernels::gelu_forward_k>(x, y), Error);
}

}  // namespace
}  // namespace loom
