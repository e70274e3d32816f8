// tests/cuda/embedding_kernel_test.cpp — the CUDA embedding kernels against the CPU kernels on
// fresh random ids and tables: every float dtype (bf16/f16 against the CPU kernel on the same
// values in f32) and every index dtype, odd widths, small vocabularies (long runs of one id, the
// backward's worst case) and a GPT-2-sized one. The gather is exact (bits compared); the
// backward starts from a random dweight and must match within tolerance() of
// tests/cuda/cpu_reference.h and repeat bit for bit (no float atomics); both also with
// ids_checked (no device check: the same bits). Out-of-range ids raise the CPU kernel's error,
// on the device and, for host ids, in ops::embedding on the host. Skips without a GPU.
#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/reduce.h"
#include "kernels/embedding.h"
#include "tests/cuda/cpu_reference.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using CudaEmbeddingTest = CudaTest;

const std::vector<DType> kIndexDTypes = {DType::kI32, DType::kI64, DType::kU16, DType::kU32};

struct Case {
  int64_t vocab, cols, tokens;
};
const Case kCases[] = {{1, 3, 17},     {7, 65, 1000},  {50, 1, 65},
                       {50257, 17, 3}, {3, 768, 4096}, {50257, 64, 8192}};

TEST_F(CudaEmbeddingTest, ForwardGathersTheCpuRows) {
  Generator gen(501);
  for (DType dt : kFloatDTypes) {
    for (DType it : kIndexDTypes) {
      for (const Case& c : kCases) {
        const std::string what = std::string("embedding_forward ") + dtype_name(dt) + "/" +
                                 dtype_name(it) + " V=" + std::to_string(c.vocab) +
                                 " C=" + std::to_string(c.cols) + " N=" + std::to_string(c.tokens);
        const Pair w = random_pair({c.vocab, c.cols}, dt, gen);
        const Tensor ids = randint({c.tokens}, 0, c.vocab, gen, it);
        Tensor want = Tensor::empty({c.tokens, c.cols}, w.cpu.dtype());
        kernels::call_kernel<kernels::embedding_forward_k>(ids, w.cpu, want, false);
        for (const bool checked : {false, true}) {  // the device's check, or the caller's
          Tensor out = poisoned_cuda({c.tokens, c.cols}, dt);
          kernels::call_kernel<kernels::embedding_forward_k>(ids.to(Device::cuda()), w.gpu, out,
                                                             checked);
          expect_same_bits(want.to(dt), out, what + (checked ? " ids_checked" : ""));
        }
      }
    }
  }
}

TEST_F(CudaEmbeddingTest, BackwardAccumulatesLikeCpuAndRepeats) {
  Generator gen(502);
  for (DType dt : kFloatDTypes) {
    for (DType it : {DType::kI64, DType::kU16}) {
      for (const Case& c : kCases) {
        const std::string what = std::string("embedding_backward ") + dtype_name(dt) + "/" +
                                 dtype_name(it) + " V=" + std::to_string(c.vocab) +
                                 " C=" + std::to_string(c.cols) + " N=" + std::to_string(c.tokens);
        const Pair dout = random_pair({c.tokens, c.cols}, dt, gen);
        const Pair dw = random_pair({c.vocab, c.cols}, dt, gen);
        const Tensor ids = randint({c.tokens}, 0, c.vocab, gen, it);
        const Tensor ids_gpu = ids.to(Device::cuda());
        Tensor got = dw.gpu.clone();
        kernels::call_kernel<kernels::embedding_backward_k>(ids_gpu, dout.gpu, got, false);
        Tensor want = dw.cpu.clone();
        kernels::call_kernel<kernels::embedding_backward_k>(ids, dout.cpu, want, false);
        expect_close(want, got, dt, what);
        Tensor again = dw.gpu.clone();  // and with the ids checked by the caller: the same bits
        kernels::call_kernel<kernels::embedding_backward_k>(ids_gpu, dout.gpu, again, true);
        expect_same_bits(got.to(Device::cpu()), again, what + " (repeat, ids_checked)");
      }
    }
  }
}

TEST_F(CudaEmbeddingTest, OutOfRangeIdsRaiseTheCpuError) {
  const Tensor w = Tensor::ones({10, 4}, DType::kF32, Device::cuda());
  for (DType it : {DType::kI32, DType::kI64}) {
    for (int64_t bad : {10, -1}) {
      const Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, bad, 4, bad}, {6})
                             .to(it)
                             .to(Device::cuda());
      const std::string expect = "embedding: id " + std::to_string(bad) +
                                 " at position 3 is out of range for a vocabulary of V=10";
      Tensor out = Tensor::empty({6, 4}, DType::kF32, Device::cuda());
      try {
        kernels::call_kernel<kernels::embedding_forward_k>(ids, w, out, false);
        ADD_FAILURE() << "forward: expected an error for id " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
      }
      Tensor dw = Tensor::zeros({10, 4}, DType::kF32, Device::cuda());
      try {
        kernels::call_kernel<kernels::embedding_backward_k>(ids, out, dw, false);
        ADD_FAILURE() << "backward: expected an error for id " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
      }
    }
  }
}

// ops::embedding with host ids and a GPU table: the ids are checked on the host (the same error,
// raised before anything is uploaded) and the lookup and its gradient equal the CPU op's.
TEST_F(CudaEmbeddingTest, OpChecksHostIdsAndMatchesCpu) {
  Generator gen(503);
  const Pair w = random_pair({50, 24}, DType::kF32, gen);
  const Tensor ids = randint({3, 17}, 0, 50, gen, DType::kI32);
  const Tensor wg = w.gpu.clone().set_requires_grad(true),
               wc = w.cpu.clone().set_requires_grad(true);
  const Tensor g = randn({3, 17, 24}, gen);
  autograd::backward(ops::sum(ops::mul(ops::embedding(ids, wg), g.to(Device::cuda()))));
  autograd::backward(ops::sum(ops::mul(ops::embedding(ids, wc), g)));
  expect_close(wc.grad(), wg.grad(), DType::kF32, "ops::embedding gradient, host ids");
  expect_same_bits(ops::embedding(ids, w.cpu), ops::embedding(ids, w.gpu),
                   "ops::embedding, host ids");
  const Tensor bad = Tensor::from_vector(std::vector<int32_t>{1, 50, 2}, {3});
  try {
    ops::embedding(bad, w.gpu);
    ADD_FAILURE() << "expected an error for id 50";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "embedding: id 50 at position 1 is out of range for a vocabulary of V=50"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom
