// kernels/cpu/parallel.h — the CPU kernels' loop helpers: OpenMP over fixed-size chunks, and a
// strided N-d walk. Work is split into chunks whose boundaries do not depend on the thread
// count, so every reduction built on these gives the same bits with 1 or 64 threads.
#pragma once

#include <omp.h>

#include <array>
#include <cstdint>

#include "core/tensor.h"

// `#pragma` cannot appear inside a macro argument (the dtype-dispatch lambdas are one), so CPU
// kernels write their vectorisation hints through _Pragma.
#define LOOM_SIMD _Pragma("omp simd")
#define LOOM_SIMD_SUM(var) _Pragma(LOOM_STRINGIFY(omp simd reduction(+ : var)))
#define LOOM_STRINGIFY(x) #x

namespace loom::kernels::cpu {

// Calls fn(begin, end) over [0, n) in chunks of `grain` elements, in parallel. Chunk edges are
// multiples of `grain`, whatever the number of threads.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks == 1) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * grain;
    fn(b, b + grain < n ? b + grain : n);
  }
}

// Grain for element-wise work: large enough that a chunk amortises the fork.
constexpr int64_t kElementGrain = 1 << 15;

// Visits every logical element of `shape`, calling fn(off[0], …, off[N-1]) with the element's
// offset (in elements) in each of N tensors described by their strides. Parallel over chunks.
template <size_t N, typename F>
void strided_for(const Shape& shape, const std::array<const Shape*, N>& strides, F&& fn) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t n = shape_numel(shape);
  parallel_for(n, kElementGrain, [&](int64_t begin, int64_t end) {
    std::array<int64_t, 16> idx{};
    LOOM_CHECK(nd <= 16, "strided_for: more than 16 dims");
    std::array<int64_t, N> off{};
    int64_t rem = begin;
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
      for (size_t t = 0; t < N; ++t) off[t] += idx[d] * (*strides[t])[d];
    }
    for (int64_t i = begin; i < end; ++i) {
      std::apply(fn, off);
      for (int64_t d = nd - 1; d >= 0; --d) {
        ++idx[d];
        for (size_t t = 0; t < N; ++t) off[t] += (*strides[t])[d];
        if (idx[d] < shape[d]) break;
        for (size_t t = 0; t < N; ++t) off[t] -= shape[d] * (*strides[t])[d];
        idx[d] = 0;
      }
    }
  });
}

// Converts between storage types through float/double (bf16/f16 go through float).
template <typename To, typename From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, BFloat16> || std::is_same_v<From, Float16>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, BFloat16> || std::is_same_v<To, Float16>) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace loom::kernels::cpu
