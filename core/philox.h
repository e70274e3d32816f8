// core/philox.h — Philox-4x32-10, the counter-based generator behind every random number in
// Loom (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
//
// Note [Counter-based randomness]: element i of a random tensor drawn at generator offset `o`
// uses counter (o + i/4) and lane i%4, so its value depends only on (seed, offset, i): not on
// the thread count, the chunking, or the device. CUDA kernels include this header to produce
// the same stream (LOOM_HD marks the functions host+device under nvcc).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__ __forceinline__
#else
#define LOOM_HD inline
#endif

namespace loom {

struct Philox4 {
  uint32_t v[4];
};

LOOM_HD uint32_t mulhilo32(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// Ten rounds over a 128-bit counter (counter, 0) with a 64-bit key (seed).
LOOM_HD Philox4 philox4x32(uint64_t counter, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo32(0xD2511F53u, c0, &hi0);
    const uint32_t lo1 = mulhilo32(0xCD9E8D57u, c2, &hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in (0, 1]: never 0, so log() is safe in Box–Muller.
LOOM_HD float uint_to_unit_float(uint32_t x) {
  return (static_cast<float>(x >> 8) + 1.0f) * (1.0f / 16777216.0f);
}
LOOM_HD double uint_to_unit_double(uint32_t x) {
  return (static_cast<double>(x) + 1.0) * (1.0 / 4294967296.0);
}

// The 32 random bits of element i at (seed, offset).
LOOM_HD uint32_t philox_bits(uint64_t seed, uint64_t offset, uint64_t i) {
  return philox4x32(offset + i / 4, seed).v[i % 4];
}

// Standard normal for element i: lanes (0,1) and (2,3) of one draw are Box–Muller pairs.
LOOM_HD double philox_normal(uint64_t seed, uint64_t offset, uint64_t i) {
  const Philox4 r = philox4x32(offset + i / 4, seed);
  const int pair = static_cast<int>((i % 4) / 2);
  const double u1 = uint_to_unit_double(r.v[2 * pair]);
  const double u2 = uint_to_unit_double(r.v[2 * pair + 1]);
  const double rad = std::sqrt(-2.0 * std::log(u1));
  const double ang = 6.283185307179586 * u2;
  return (i % 2 == 0) ? rad * std::cos(ang) : rad * std::sin(ang);
}

}  // namespace loom
