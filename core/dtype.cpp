// core/dtype.cpp — dtype tables and the IEEE half-precision conversions.
#include "core/dtype.h"

#include "core/error.h"

namespace loom {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
    case DType::kU32:
      return 4;
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kBF16:
    case DType::kF16:
    case DType::kU16:
      return 2;
  }
  LOOM_FAIL("dtype_size: unknown dtype");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU16:
      return "u16";
    case DType::kU32:
      return "u32";
  }
  return "?";
}

bool is_floating(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16 || t == DType::kF16;
}

Float16::Float16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) {
    bits = static_cast<uint16_t>(sign | 0x7e00u);
    return;
  }  // NaN
  if (absx >= 0x477ff000u) {
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }                          // overflow → inf
  if (absx < 0x38800000u) {  // result is subnormal (or zero): scale into the subnormal grid
    float a;
    std::memcpy(&a, &absx, 4);
    // 2^-24 is the smallest subnormal; adding 0.5 makes float rounding do RNE on the grid.
    const float scaled = a * 16777216.0f;  // a / 2^-24
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    bits = static_cast<uint16_t>(sign | m);
    return;
  }
  // Normal: rebias exponent 127 → 15, round the 13 dropped mantissa bits to nearest even.
  uint32_t r = absx - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  bits = static_cast<uint16_t>(sign | (r >> 13));
}

Float16::operator float() const {
  const uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t man = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;  // man · 2^-24
    std::memcpy(&out, &v, 4);
    out |= sign;
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (man << 13);
  } else {
    out = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

}  // namespace loom
