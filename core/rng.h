// core/rng.h — Generator (a seed and a counter offset) and random tensor factories.
// Generators are explicit objects passed to whoever draws; there is no default generator.
// See Note [Counter-based randomness] in core/philox.h.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace loom {

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // in Philox counters (4 numbers each)
};

class Generator {
 public:
  explicit Generator(uint64_t seed) : state_{seed, 0} {}
  GeneratorState state() const { return state_; }
  void set_state(GeneratorState s) { state_ = s; }
  uint64_t seed() const { return state_.seed; }
  // Reserves counters for `numel` numbers and returns the offset to draw them at.
  uint64_t reserve(int64_t numel) {
    const uint64_t at = state_.offset;
    state_.offset += (static_cast<uint64_t>(numel) + 3) / 4;
    return at;
  }

 private:
  GeneratorState state_;
};

// N(mean, std²) and U[lo, hi) tensors (floating dtypes), drawn on the CPU then moved to device.
Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::kF32, double mean = 0.0,
             double std = 1.0, Device device = {});
Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::kF32, double lo = 0.0,
            double hi = 1.0, Device device = {});
// Integers uniform in [lo, hi) (token ids, indices).
Tensor randint(const Shape& shape, int64_t lo, int64_t hi, Generator& gen,
               DType dtype = DType::kI64, Device device = {});

}  // namespace loom
