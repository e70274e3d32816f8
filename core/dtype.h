// core/dtype.h — element types, their sizes and names, and the 16-bit float formats.
// bf16 and f16 are storage types: kernels widen them to f32 to compute. Nothing here allocates.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace loom {

enum class DType : int8_t { kF32, kF64, kBF16, kF16, kI32, kI64, kU16, kU32 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
bool is_floating(DType t);

// bfloat16: the high half of an IEEE f32; converted with round-to-nearest-even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// IEEE half precision, converted with round-to-nearest-even (subnormals kept).
struct Float16 {
  uint16_t bits = 0;
  Float16() = default;
  explicit Float16(float f);
  explicit operator float() const;
};

// clang-format off
// (tables: one line per dtype, here and in the dispatch macros below)
// Maps a C++ scalar type to its DType.
template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kF64; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBF16; };
template <> struct DTypeOf<Float16> { static constexpr DType value = DType::kF16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct DTypeOf<uint16_t> { static constexpr DType value = DType::kU16; };
template <> struct DTypeOf<uint32_t> { static constexpr DType value = DType::kU32; };

}  // namespace loom

// LOOM_DISPATCH_FLOAT(dtype, name, body): runs body with `scalar_t` bound to float or double;
// any other dtype is an error naming the op.
#define LOOM_DISPATCH_FLOAT(dtype, opname, ...)                                     \
  [&] {                                                                             \
    switch (dtype) {                                                                \
      case ::loom::DType::kF32: { using scalar_t = float; return __VA_ARGS__(); }   \
      case ::loom::DType::kF64: { using scalar_t = double; return __VA_ARGS__(); }  \
      default:                                                                      \
        LOOM_FAIL(opname, ": dtype ", ::loom::dtype_name(dtype), " not supported (f32, f64)"); \
    }                                                                               \
  }()

// LOOM_DISPATCH_INDEX(dtype, name, body): `index_t` bound to the integer token/index types.
#define LOOM_DISPATCH_INDEX(dtype, opname, ...)                                         \
  [&] {                                                                                 \
    switch (dtype) {                                                                    \
      case ::loom::DType::kI32: { using index_t = int32_t; return __VA_ARGS__(); }      \
      case ::loom::DType::kI64: { using index_t = int64_t; return __VA_ARGS__(); }      \
      case ::loom::DType::kU16: { using index_t = uint16_t; return __VA_ARGS__(); }     \
      case ::loom::DType::kU32: { using index_t = uint32_t; return __VA_ARGS__(); }     \
      default:                                                                          \
        LOOM_FAIL(opname, ": index dtype ", ::loom::dtype_name(dtype), " not supported"); \
    }                                                                                   \
  }()

// LOOM_DISPATCH_ALL(dtype, name, body): every dtype, `scalar_t` bound to its storage type.
#define LOOM_DISPATCH_ALL(dtype, opname, ...)                                             \
  [&] {                                                                                   \
    switch (dtype) {                                                                      \
      case ::loom::DType::kF32: { using scalar_t = float; return __VA_ARGS__(); }         \
      case ::loom::DType::kF64: { using scalar_t = double; return __VA_ARGS__(); }        \
      case ::loom::DType::kBF16: { using scalar_t = ::loom::BFloat16; return __VA_ARGS__(); } \
      case ::loom::DType::kF16: { using scalar_t = ::loom::Float16; return __VA_ARGS__(); }   \
      case ::loom::DType::kI32: { using scalar_t = int32_t; return __VA_ARGS__(); }       \
      case ::loom::DType::kI64: { using scalar_t = int64_t; return __VA_ARGS__(); }       \
      case ::loom::DType::kU16: { using scalar_t = uint16_t; return __VA_ARGS__(); }      \
      case ::loom::DType::kU32: { using scalar_t = uint32_t; return __VA_ARGS__(); }      \
    }                                                                                     \
    LOOM_FAIL(opname, ": unknown dtype");                                                 \
  }()
// clang-format on
