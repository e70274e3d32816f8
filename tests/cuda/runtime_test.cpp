// tests/cuda/runtime_test.cpp — the minimal CUDA runtime (kernels/cuda/): host↔device round
// trips, fill, strided and dtype-converting device copies, the caching allocator's statistics,
// the staged uploads, and the trainer's asynchronous Readback (against the blocking read). Every
// other GPU result is compared bit for bit with the CPU kernels' result. Uses only Loom's API (no
// CUDA headers), so it builds in CPU-only builds too; each test skips itself, with the reason,
// when the process sees no CUDA device.
#include <string>
#include <vector>

#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "tests/cuda/cuda_test_util.h"
#include "train/readback.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using CudaRuntimeTest = CudaTest;

TEST_F(CudaRuntimeTest, RoundTripIsBitExactForEveryDTypeAndOddSizes) {
  Generator gen(11);
  for (DType dt : kAllDTypes) {
    for (int64_t n : {1, 3, 17, 65, 1000003}) {
      const Tensor x = random_tensor({n}, dt, gen);
      const Tensor g = x.to(Device::cuda());
      ASSERT_EQ(g.device(), Device::cuda());
      expect_same_bits(x, g,
                       std::string("round trip ") + dtype_name(dt) + " n=" + std::to_string(n));
    }
    const Tensor m = random_tensor({3, 17, 5}, dt, gen);
    expect_same_bits(m, m.to(Device::cuda()), std::string("round trip 3-d ") + dtype_name(dt));
  }
}

TEST_F(CudaRuntimeTest, FillMatchesCpu) {
  for (DType dt : kAllDTypes) {
    std::vector<double> values = {0.0, 7.0, 250.0};
    if (dt == DType::kI32 || dt == DType::kI64) values.push_back(-3.0);
    if (is_floating(dt)) {
      values.insert(values.end(),
                    {0.1, -2.75, 1e-6, 7e4, 1e300, std::numeric_limits<double>::quiet_NaN()});
    }
    for (double v : values) {
      for (int64_t n : {1, 17, 1000003}) {
        const std::string what = std::string("fill ") + dtype_name(dt) + " " + std::to_string(v);
        expect_same_bits(Tensor::full({n}, v, dt), Tensor::full({n}, v, dt, Device::cuda()), what);
      }
    }
  }
}

TEST_F(CudaRuntimeTest, FillOfAStridedViewTouchesOnlyTheView) {
  Generator gen(5);
  const Tensor x = random_tensor({6, 9}, DType::kF32, gen);
  Tensor cpu = x.clone();
  Tensor gpu = x.to(Device::cuda());
  Tensor cpu_view = cpu.transpose(0, 1).narrow(0, 2, 4);
  Tensor gpu_view = gpu.transpose(0, 1).narrow(0, 2, 4);
  kernels::call_kernel<kernels::fill_k>(cpu_view, -1.25);
  kernels::call_kernel<kernels::fill_k>(gpu_view, -1.25);
  expect_same_bits(cpu, gpu, "strided fill");
}

TEST_F(CudaRuntimeTest, StridedCopyMatchesCpuForEveryDTypePair) {
  Generator gen(3);
  // Values in [0, 100): every conversion between the eight dtypes is defined on both backends.
  const Tensor base = rand({37, 65}, gen, DType::kF64, 0.0, 100.0);
  for (DType from : kAllDTypes) {
    const Tensor src = base.to(from);
    const Tensor src_gpu = src.to(Device::cuda());
    for (DType to : kAllDTypes) {
      const std::string what =
          std::string("transpose copy ") + dtype_name(from) + "→" + dtype_name(to);
      Tensor out = poisoned_cuda({65, 37}, to);
      ops::copy_(out, src_gpu.transpose(0, 1));
      Tensor want = Tensor::empty({65, 37}, to);
      ops::copy_(want, src.transpose(0, 1));
      expect_same_bits(want, out, what);
    }
  }
}

TEST_F(CudaRuntimeTest, FloatConversionsMatchCpuIncludingOverflowAndNaN) {
  Generator gen(9);
  const Tensor x = randn({1000003}, gen, DType::kF64, 0.0, 1.0);
  // Spread magnitudes over f16's subnormal range (1e-8) up to past its overflow (1e5), and add
  // NaN/inf.
  std::vector<double> v = x.to_vector();
  for (size_t i = 0; i < v.size(); ++i) v[i] *= std::pow(10.0, static_cast<double>(i % 14) - 8.0);
  v[5] = std::numeric_limits<double>::quiet_NaN();
  v[6] = std::numeric_limits<double>::infinity();
  v[7] = -std::numeric_limits<double>::infinity();
  const Tensor wide = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  for (DType from : kFloatDTypes) {
    const Tensor src = wide.to(from);
    const Tensor src_gpu = src.to(Device::cuda());
    for (DType to : kFloatDTypes) {
      Tensor out = poisoned_cuda(src.shape(), to);
      ops::copy_(out, src_gpu);
      expect_same_bits(src.to(to), out,
                       std::string("convert ") + dtype_name(from) + "→" + dtype_name(to));
    }
  }
}

TEST_F(CudaRuntimeTest, LayoutOpsOnGpuMatchCpu) {
  Generator gen(4);
  const Tensor x = randn({5, 7, 9}, gen, DType::kF32);
  const Tensor g = x.to(Device::cuda());
  expect_same_bits(x.transpose(0, 2).contiguous(), g.transpose(0, 2).contiguous(), "transpose");
  expect_same_bits(x.to(DType::kBF16), g.to(DType::kBF16), "to bf16");
  const Tensor xv = x.permute({2, 0, 1}).narrow(1, 1, 3);
  const Tensor gv = g.permute({2, 0, 1}).narrow(1, 1, 3);
  expect_same_bits(xv.to(DType::kF16), gv.to(DType::kF16), "permute+narrow to f16");
  expect_same_bits(x.expand({4, 5, 7, 9}).contiguous(), g.expand({4, 5, 7, 9}).contiguous(),
                   "expand");
  expect_same_bits(x.clone(), g.clone(), "contiguous same-dtype device copy");
}

TEST_F(CudaRuntimeTest, AllocatorStatsRiseAndFall) {
  Allocator& alloc = allocator_for(DeviceType::kCuda);
  const AllocatorStats before = alloc.stats();
  alloc.reset_peak();
  const int64_t bytes_a = 1000 * 4, bytes_b = 12345 * 8, bytes_c = (3 << 20) * 2;
  {
    Tensor a = Tensor::empty({1000}, DType::kF32, Device::cuda());
    Tensor b = Tensor::empty({12345}, DType::kF64, Device::cuda());
    Tensor c = Tensor::empty({3 << 20}, DType::kBF16, Device::cuda());
    const AllocatorStats during = alloc.stats();
    EXPECT_EQ(during.current_bytes, before.current_bytes + bytes_a + bytes_b + bytes_c);
    EXPECT_GE(during.peak_bytes, during.current_bytes);
    EXPECT_EQ(during.num_allocs, before.num_allocs + 3);
  }
  const AllocatorStats after = alloc.stats();
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_GE(after.peak_bytes, before.current_bytes + bytes_a + bytes_b + bytes_c);
  alloc.reset_peak();
  EXPECT_EQ(alloc.stats().peak_bytes, after.current_bytes);
}

// Reuse shows as reserved memory that does not grow: which cached block of the size class is
// handed out depends on what earlier tests left in the cache, so pointers are not compared.
TEST_F(CudaRuntimeTest, CachingAllocatorReusesFreedBlocks) {
  Allocator& alloc = allocator_for(DeviceType::kCuda);
  for (int64_t n : {100, 3 << 20}) {
    { Tensor t = Tensor::empty({n}, DType::kF32, Device::cuda()); }
    const int64_t reserved = alloc.stats().reserved_bytes;
    // Same size, and a slightly smaller one rounding to the same block: both reuse a cached one.
    Tensor again = Tensor::empty({n}, DType::kF32, Device::cuda());
    EXPECT_EQ(alloc.stats().reserved_bytes, reserved) << "n=" << n;
    again = Tensor();
    Tensor smaller = Tensor::empty({n - 7}, DType::kF32, Device::cuda());
    EXPECT_EQ(alloc.stats().reserved_bytes, reserved) << "n=" << n;
  }
}

TEST_F(CudaRuntimeTest, BadDeviceIndexIsALoomError) {
  try {
    Tensor::empty({4}, DType::kF32, Device::cuda(999));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
}

// Note [Asynchronous uploads]: behind a long GEMM, 40 staged uploads each followed by
// overwriting the host source, and one upload above the staging limit (the blocking path): every
// device tensor holds the bytes it was given. An upload into a tensor that a queued GEMM still
// reads does not overtake it.
TEST_F(CudaRuntimeTest, StagedUploadsKeepTheirBytesAndStreamOrder) {
  Generator gen(19);
  const Tensor a = randn({2048, 2048}, gen).to(Device::cuda()), b = randn({2048, 2048}, gen);
  Tensor b_gpu = b.to(Device::cuda());
  const Tensor c = ops::matmul(a, b_gpu);  // queued: reads b_gpu
  // An upload, then a device copy into b_gpu: both must wait for the GEMM (copy_ works within
  // one device; an upload is Tensor::to).
  ops::copy_(b_gpu, Tensor::zeros({2048, 2048}).to(Device::cuda()));
  std::vector<Tensor> want, got;
  for (int i = 0; i < 40; ++i) {
    Tensor h = randn({1000 + 37 * i}, gen);
    want.push_back(h.clone());
    got.push_back(h.to(Device::cuda()));
    ops::copy_(h, Tensor::zeros(h.shape()));  // the host bytes may change at once
  }
  Tensor big = randn({5 << 20}, gen);  // 20 MiB: the blocking path
  want.push_back(big.clone());
  got.push_back(big.to(Device::cuda()));
  for (size_t i = 0; i < want.size(); ++i)
    expect_same_bits(want[i], got[i], "upload " + std::to_string(i));
  expect_same_bits(ops::matmul(a, b.to(Device::cuda())).to(Device::cpu()), c,
                   "GEMM queued before the upload");
  expect_same_bits(Tensor::zeros({2048, 2048}), b_gpu, "the upload itself");
}

// Readback (train/readback.h) on the GPU: a read started right behind a long GEMM and a sum of
// its result returns the sum (the copy waits for the compute stream's work); four reads may be
// pending at once, each with its own values, a fifth is refused until one is released.
TEST_F(CudaRuntimeTest, ReadbackFollowsTheComputeStream) {
  Generator gen(17);
  const Tensor a = randn({2048, 2048}, gen), b = randn({2048, 2048}, gen);
  Readback rb;
  std::vector<Readback::Pending> pending;
  std::vector<double> want;
  for (int i = 0; i < Readback::kSlots; ++i) {
    const Tensor c = ops::matmul(a.to(Device::cuda()), ops::scale(b, 1.0 + i).to(Device::cuda()));
    const Tensor values = ops::reshape(ops::sum_squares(c), {1});  // f64 on the GPU
    pending.push_back(rb.start(values));
    want.push_back(ops::sum_squares(c).to(Device::cpu()).item());  // the blocking read
  }
  EXPECT_THROW(rb.start(Tensor::zeros({1}, DType::kF64, Device::cuda())), Error);
  for (int i = 0; i < Readback::kSlots; ++i) {
    const std::vector<double>& got = pending[static_cast<size_t>(i)].get();
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0], want[static_cast<size_t>(i)]) << "read " << i;
  }
  pending.pop_back();  // a slot released: reads start again
  Readback::Pending more = rb.start(Tensor::full({3}, 2.5, DType::kF64, Device::cuda()));
  EXPECT_EQ(more.get(), std::vector<double>({2.5, 2.5, 2.5}));
}

}  // namespace
}  // namespace loom
