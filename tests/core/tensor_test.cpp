// tests/core/tensor_test.cpp — storage sharing by views, reshape/view rules, dtype conversion,
// the CPU allocator's statistics and alignment, and releasable storage.
#include "core/tensor.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cmath>
#include <fstream>
#include <string>

#include "core/block_cache.h"
#include "core/ops/view.h"
#include "core/rng.h"
#include "kernels/registry.h"

namespace loom {
namespace {

Tensor iota(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return Tensor::from_vector(v, shape);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor x = iota({4, 6});
  Tensor t = x.transpose(0, 1);
  Tensor n = x.narrow(1, 2, 3);
  Tensor r = x.reshape({2, 12});
  EXPECT_EQ(t.storage(), x.storage());
  EXPECT_EQ(n.storage(), x.storage());
  EXPECT_EQ(r.storage(), x.storage());
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.at({5, 3}), x.at({3, 5}));
  EXPECT_EQ(n.at({1, 0}), x.at({1, 2}));
  x.data<float>()[1 * 6 + 2] = -7.0f;  // writes through every view
  EXPECT_EQ(n.at({1, 0}), -7.0);
  EXPECT_EQ(t.at({2, 1}), -7.0);
  EXPECT_EQ(r.at({0, 8}), -7.0);
}

TEST(Tensor, ContiguousCopiesOnlyWhenNeeded) {
  Tensor x = iota({3, 5});
  EXPECT_TRUE(x.contiguous().same(x));
  Tensor t = x.transpose(0, 1).contiguous();
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_NE(t.storage(), x.storage());
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(t.at({i, j}), x.at({j, i}));
}

TEST(Tensor, ReshapeOfNonContiguousViewsWhenPossible) {
  Tensor x = iota({2, 3, 4});
  Tensor p = x.permute({1, 0, 2});     // (3, 2, 4): last dim still contiguous
  Tensor v = p.reshape({3, 2, 2, 2});  // splits the contiguous last dim: a view
  EXPECT_EQ(v.storage(), x.storage());
  EXPECT_EQ(v.at({2, 1, 1, 0}), x.at({1, 2, 2}));
  Tensor c = p.reshape({6, 4});  // merges non-adjacent dims: must copy
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_EQ(c.at({5, 3}), x.at({1, 2, 3}));
  EXPECT_THROW(p.view({6, 4}), Error);
  EXPECT_EQ(x.reshape({-1, 4}).shape(), (Shape{6, 4}));
  EXPECT_THROW(x.reshape({5, -1}), Error);
}

TEST(Tensor, ExpandUsesZeroStride) {
  Tensor b = iota({3});
  Tensor e = b.expand({4, 3});
  EXPECT_EQ(e.strides(), (Shape{0, 1}));
  EXPECT_EQ(e.at({3, 2}), 2.0);
  EXPECT_THROW(b.expand({4, 2}), Error);
}

TEST(Tensor, CatAndSplitRoundTrip) {
  Tensor a = iota({2, 3}), b = iota({2, 5});
  Tensor c = ops::cat({a, b}, 1);
  EXPECT_EQ(c.shape(), (Shape{2, 8}));
  auto parts = ops::split(c, {3, 5}, 1);
  EXPECT_EQ(parts[0].to_vector(), a.to_vector());
  EXPECT_EQ(parts[1].to_vector(), b.to_vector());
  EXPECT_THROW(ops::split(c, {3, 4}, 1), Error);
}

TEST(Tensor, DTypeConversions) {
  Generator gen(5);
  Tensor x = randn({65}, gen, DType::kF64, 0.0, 100.0);
  // f64 → f32 → f64 keeps f32 precision; bf16 and f16 keep about 3 and 4 significant digits.
  struct Case {
    DType t;
    double rel;
  };
  for (Case c : {Case{DType::kF32, 1e-7}, Case{DType::kBF16, 4e-3}, Case{DType::kF16, 5e-4}}) {
    const auto back = x.to(c.t).to(DType::kF64).to_vector();
    const auto ref = x.to_vector();
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_NEAR(back[i], ref[i], c.rel * std::abs(ref[i]) + 1e-30) << dtype_name(c.t);
    }
  }
  // Integers truncate toward zero like a C cast; u16 holds token ids.
  Tensor f = Tensor::from_vector(std::vector<double>{3.7, -2.2, 50256.0}, {3});
  EXPECT_EQ(f.to(DType::kI32).to_vector(), (std::vector<double>{3, -2, 50256}));
  EXPECT_EQ(f.narrow(0, 2, 1).to(DType::kU16).to_vector(), (std::vector<double>{50256}));
  EXPECT_EQ(f.to(DType::kI64).to(DType::kF32).to_vector(), (std::vector<double>{3, -2, 50256}));
}

TEST(Tensor, HalfPrecisionRoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties go to even (1).
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  // f16: 65504 is the largest finite value; 2^-24 the smallest subnormal.
  EXPECT_EQ(static_cast<float>(Float16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(static_cast<float>(Float16(70000.0f))));
  EXPECT_EQ(static_cast<float>(Float16(5.9604645e-8f)), 5.9604645e-8f);
  EXPECT_EQ(static_cast<float>(Float16(-1.5f)), -1.5f);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(NAN))));
}

// Note [Releasable storage]: release() returns the bytes to the allocator while views keep the
// Storage; reading then throws; materialize() brings a buffer back that the views see.
TEST(Allocator, ReleasedStorageFreesItsBytesAndViewsSeeTheNewBuffer) {
  Allocator& a = allocator_for(DeviceType::kCpu);
  const int64_t before = a.stats().current_bytes;
  Tensor x = Tensor::full({1000}, 2.0, DType::kF32);
  Tensor v = x.narrow(0, 10, 5);  // a view: same Storage
  EXPECT_EQ(a.stats().current_bytes, before + 4000);
  x.storage()->release();
  x.storage()->release();  // a no-op the second time
  EXPECT_TRUE(v.storage()->released());
  EXPECT_EQ(a.stats().current_bytes, before);
  EXPECT_THROW(v.to_vector(), Error);
  x.storage()->materialize();
  EXPECT_EQ(a.stats().current_bytes, before + 4000);
  x.data<float>()[12] = 7.0f;
  EXPECT_EQ(v.at({2}), 7.0);
  x.storage()->release();
  x = Tensor();
  v = Tensor();  // destroying a released Storage frees nothing twice
  EXPECT_EQ(a.stats().current_bytes, before);
}

TEST(Allocator, CountsCurrentAndPeakBytes) {
  Allocator& a = allocator_for(DeviceType::kCpu);
  const AllocatorStats before = a.stats();
  a.reset_peak();
  {
    Tensor x = Tensor::empty({1000}, DType::kF32);
    Tensor y = Tensor::empty({500}, DType::kF64);
    EXPECT_EQ(a.stats().current_bytes, before.current_bytes + 4000 + 4000);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(x.raw_data()) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(y.raw_data()) % 64, 0u);
    Tensor v = x.reshape({10, 100});  // a view allocates nothing
    EXPECT_EQ(a.stats().current_bytes, before.current_bytes + 8000);
  }
  EXPECT_EQ(a.stats().current_bytes, before.current_bytes);
  EXPECT_GE(a.stats().peak_bytes, before.current_bytes + 8000);
}

// Note [Block cache]: a request takes the smallest cached block of its size up to twice it;
// take_below hands out the largest block below a request (to be grown).
TEST(Allocator, BlockCacheTakesTheBlockThatFits) {
  constexpr size_t MiB = size_t{1} << 20;
  EXPECT_EQ(BlockCache::block_size_for(1000), 1024U);
  EXPECT_EQ(BlockCache::block_size_for(MiB + 1), 2 * MiB);
  int blocks[3];
  BlockCache cache;
  cache.put(&blocks[0], 4 * MiB);
  cache.put(&blocks[1], 8 * MiB);
  cache.put(&blocks[2], 20 * MiB);
  size_t got = 0;
  EXPECT_EQ(cache.take(9 * MiB, &got), nullptr);  // 20 MiB is more than twice 9
  EXPECT_EQ(cache.take(4 * MiB, &got), &blocks[0]);
  EXPECT_EQ(got, 4 * MiB);
  EXPECT_EQ(cache.take_below(10 * MiB, &got), &blocks[1]);
  EXPECT_EQ(got, 8 * MiB);
  EXPECT_EQ(cache.take_below(10 * MiB, &got), nullptr);
  EXPECT_EQ(cache.cached_bytes(), 20 * MiB);
}

// Note [Growing a block] in core/allocator.cpp: a request a little larger than every cached
// block grows the largest one, so only the growth is fresh pages (counted as minor faults).
TEST(Allocator, GrowsACachedBlockInsteadOfMappingFreshPages) {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  if (mode.find("[always]") != std::string::npos)
    GTEST_SKIP() << "transparent huge pages always on: fresh pages fault once per 2 MiB";
  Allocator& a = allocator_for(DeviceType::kCpu);
  a.release_cached();
  auto minor_faults = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<int64_t>(u.ru_minflt);
  };
  constexpr int64_t kFloats = int64_t{64} << 18;  // 64 MiB
  { Tensor::full({kFloats}, 1.0, DType::kF32); }  // touched, then cached
  const int64_t before = minor_faults();
  {
    Tensor grown = Tensor::full({kFloats * 5 / 4 + 1}, 2.0, DType::kF32);  // 80 MiB + 4 B
    EXPECT_EQ(grown.data<float>()[kFloats], 2.0f);
  }
  const int64_t faults = minor_faults() - before;
  const int64_t pages = kFloats * 5 / 4 * 4 / 4096;  // a fresh 80 MiB block's first touches
  EXPECT_LT(faults, pages / 2) << "the 64 MiB block was not grown: " << faults << " faults";
  a.release_cached();
}

TEST(Allocator, MissingBackendIsAClearError) {
  if (kernels::Registry::instance().has("device_count", DeviceType::kCuda)) {
    GTEST_SKIP() << "this build has a CUDA allocator";
  }
  try {
    Tensor::empty({3}, DType::kF32, Device::cuda());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no allocator for device cuda"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom
