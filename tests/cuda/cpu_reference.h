// tests/cuda/cpu_reference.h — what the element-wise CUDA kernel tests share on top of
// cuda_test_util.h: a random input as a CUDA tensor together with its CPU reference copy in the
// dtype the CPU kernel computes in (f32 for bf16/f16, which the CPU kernels reject: the CUDA
// kernel's 16-bit result is then checked against the CPU kernel run on the same values upcast),
// and the tolerance of ‖got − want‖ / ‖want‖ per dtype. Uses only Loom's API.
#pragma once

#include <string>

#include "tests/cuda/cuda_test_util.h"

namespace loom::cuda_test {

// Sizes every element-wise test covers: tiny, odd, not a multiple of any pack, and large.
const std::vector<int64_t> kOddSizes = {1, 3, 17, 65, 1000003};

// The dtype the CPU kernel computes a reference in.
inline DType reference_dtype(DType dt) {
  return dt == DType::kBF16 || dt == DType::kF16 ? DType::kF32 : dt;
}

// Relative-error tolerances (DESIGN §3): f32 1e-6 (rounding differs only in exp and in
// summation order), f64 1e-12, bf16 1e-2 (8-bit mantissa), f16 2e-3 (11-bit mantissa).
inline double tolerance(DType dt) {
  switch (dt) {
    case DType::kF64:
      return 1e-12;
    case DType::kBF16:
      return 1e-2;
    case DType::kF16:
      return 2e-3;
    default:
      return 1e-6;
  }
}

struct Pair {
  Tensor cpu;  // reference copy, reference_dtype
  Tensor gpu;  // the same values, dtype as asked, on the GPU
};

// Random values (never all zero) in dtype `dt`, as a CPU reference and a CUDA tensor.
inline Pair random_pair(const Shape& shape, DType dt, Generator& gen) {
  const Tensor x = random_tensor(shape, dt, gen);
  return {x.to(reference_dtype(dt)), x.to(Device::cuda())};
}

inline std::string label(const std::string& what, DType dt, int64_t n) {
  return what + " " + dtype_name(dt) + " n=" + std::to_string(n);
}

// Checks rel_error(want, got) <= tolerance(dt), naming the case.
inline void expect_close(const Tensor& want, const Tensor& got, DType dt, const std::string& what) {
  const double err = rel_error(want, got);
  EXPECT_LE(err, tolerance(dt)) << what << ": relative error " << err;
}

}  // namespace loom::cuda_test
