// kernels/cuda/dtype_convert.cuh — device-side element conversions that give the same bits as
// the CPU's convert<To>(From) (kernels/cpu/parallel.h and the BFloat16/Float16 constructors in
// core/dtype.{h,cpp}): bf16 and f16 go through f32 with round-to-nearest-even and the same NaN
// and subnormal handling, so a CUDA copy and the CPU copy agree bit for bit. Storage types are
// Loom's own (loom::BFloat16 / loom::Float16 hold a uint16_t), so LOOM_DISPATCH_ALL serves the
// host side. Nothing here may call the host-only BFloat16/Float16 constructors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace loom::kernels::cuda {

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// Mirrors BFloat16(float) in core/dtype.h.
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Mirrors Float16::operator float() in core/dtype.cpp.
__device__ __forceinline__ float f16_bits_to_float(uint16_t bits) {
  const uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t man = bits & 0x3ffu;
  if (exp == 0) {
    return __uint_as_float(
        __float_as_uint(__fmul_rn(static_cast<float>(man), 5.9604644775390625e-8f)) | sign);
  }
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// Mirrors Float16(float) in core/dtype.cpp.
__device__ __forceinline__ uint16_t float_to_f16_bits(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (absx < 0x38800000u) {                                               // subnormal or zero
    const float scaled = __fmul_rn(__uint_as_float(absx), 16777216.0f);
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = __fsub_rn(scaled, static_cast<float>(m));
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t r = absx - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

template <typename T>
inline constexpr bool kIsHalf = std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;

// The f32 value of a 16-bit float.
template <typename T>
__device__ __forceinline__ float half_to_float(T v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return bf16_bits_to_float(v.bits);
  } else {
    return f16_bits_to_float(v.bits);
  }
}

template <typename T>
__device__ __forceinline__ T half_from_float(float f) {
  T out;
  if constexpr (std::is_same_v<T, BFloat16>) {
    out.bits = float_to_bf16_bits(f);
  } else {
    out.bits = float_to_f16_bits(f);
  }
  return out;
}

// convert<To>(From) of kernels/cpu/parallel.h, on the device.
template <typename To, typename From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (kIsHalf<From>) {
    return convert<To>(half_to_float(v));
  } else if constexpr (kIsHalf<To>) {
    return half_from_float<To>(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace loom::kernels::cuda
