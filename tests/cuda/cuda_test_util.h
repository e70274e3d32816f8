// tests/cuda/cuda_test_util.h — what every CUDA test shares: the skip-with-reason fixture
// (CudaTest), random inputs of any dtype (never zeros), poisoned outputs (NaN or a sentinel, so
// an element a kernel skips cannot pass), bit-exact comparison and the relative error
// ‖got − want‖ / ‖want‖ used for kernels that round differently from the CPU (DESIGN §3).
// Uses only Loom's API (no CUDA headers), so it builds in CPU-only builds too.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/ops/view.h"
#include "core/rng.h"
#include "kernels/copy.h"
#include "kernels/registry.h"

namespace loom::cuda_test {

const std::vector<DType> kAllDTypes = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                                       DType::kI32, DType::kI64, DType::kU16,  DType::kU32};
const std::vector<DType> kFloatDTypes = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};

// Empty when a CUDA device is usable; otherwise why not.
inline std::string no_device_reason() {
  if (!kernels::Registry::instance().has("device_count", DeviceType::kCuda)) {
    return "this build has no CUDA backend (configured with LOOM_CUDA=OFF)";
  }
  const int n = kernels::find_kernel<kernels::device_count_k>(DeviceType::kCuda)();
  if (n <= 0) return "cudaGetDeviceCount found no usable GPU (no device or no driver)";
  return "";
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = no_device_reason();
    if (!reason.empty()) GTEST_SKIP() << "no CUDA device: " << reason;
  }
};

// Random values of any dtype: normals for floats, the whole (double-exact) range for integers.
inline Tensor random_tensor(const Shape& shape, DType dtype, Generator& gen) {
  switch (dtype) {
    case DType::kI32:
      return randint(shape, -(int64_t{1} << 31), int64_t{1} << 31, gen, dtype);
    case DType::kI64:
      return randint(shape, -(int64_t{1} << 52), int64_t{1} << 52, gen, dtype);
    case DType::kU16:
      return randint(shape, 0, int64_t{1} << 16, gen, dtype);
    case DType::kU32:
      return randint(shape, 0, int64_t{1} << 32, gen, dtype);
    default:
      return randn(shape, gen, dtype, 0.0, 3.0);
  }
}

// A CUDA tensor whose every element is garbage (NaN, or a sentinel for integers), so a kernel
// that skips an element cannot pass.
inline Tensor poisoned_cuda(const Shape& shape, DType dtype) {
  const double poison = is_floating(dtype) ? std::numeric_limits<double>::quiet_NaN() : 77.0;
  return Tensor::full(shape, poison, dtype, Device::cuda());
}

// Bit-exact equality of two tensors' logical contents; the second may live on the GPU. The one
// allowance: where both hold a NaN, its payload may differ (the GPU's f64→f32 conversion
// produces the canonical NaN, the host keeps the payload).
inline void expect_same_bits(const Tensor& want_cpu, const Tensor& got, const std::string& what) {
  const Tensor a = want_cpu.contiguous();
  const Tensor b = got.to(Device::cpu()).contiguous();
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pb = static_cast<const unsigned char*>(b.raw_data());
  const size_t esize = dtype_size(a.dtype());
  std::vector<double> va, vb;  // filled on the first mismatch
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(pa + i * esize, pb + i * esize, esize) == 0) continue;
    if (va.empty()) {
      va = a.to_vector();
      vb = b.to_vector();
    }
    if (std::isnan(va[i]) && std::isnan(vb[i])) continue;
    ADD_FAILURE() << what << ": element " << i << " differs (" << va[i] << " vs " << vb[i] << ")";
    return;
  }
}

// ‖got − want‖₂ / ‖want‖₂ over all elements, computed in double on the host; +inf when got holds
// a NaN or an infinity that want does not (so NaN never passes a tolerance), 0 when both are 0.
inline double rel_error(const Tensor& want, const Tensor& got) {
  const std::vector<double> a = want.to(Device::cpu()).contiguous().to_vector();
  const std::vector<double> b = got.to(Device::cpu()).contiguous().to_vector();
  EXPECT_EQ(a.size(), b.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(b[i]) && std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    num += (b[i] - a[i]) * (b[i] - a[i]);
    den += a[i] * a[i];
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

// Storage dtypes the kernels compute in f32 (so the CPU reference runs on the values upcast).
inline bool is_half(DType dt) { return dt == DType::kBF16 || dt == DType::kF16; }

// The relative tolerance against the CPU kernel per dtype (DESIGN §3): f64 1e-12, f32 1e-5,
// bf16/f16 1e-2.
inline double tol(DType dt) {
  if (dt == DType::kF64) return 1e-12;
  return is_half(dt) ? 1e-2 : 1e-5;
}

// The CPU copy of t the reference runs on: f32 for bf16/f16, t's dtype otherwise.
inline Tensor to_ref(const Tensor& t) {
  const Tensor c = t.to(Device::cpu());
  return is_half(c.dtype()) ? c.to(DType::kF32) : c.clone();
}

// A GPU copy of t; when misalign, its data starts one element past a 16-byte boundary (so the
// kernels' vector paths must fall back).
inline Tensor to_gpu(const Tensor& t, bool misalign = false) {
  if (!misalign) return t.to(Device::cuda());
  Tensor flat = Tensor::empty({t.numel() + 1}, t.dtype(), Device::cuda());
  Tensor view = flat.narrow(0, 1, t.numel()).view(t.shape());
  ops::copy_(view, t.to(Device::cuda()));
  return view;
}

// A fresh seed per run (inputs differ every run; tests print it on failure).
inline uint64_t fresh_seed() {
  return (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
}

}  // namespace loom::cuda_test
