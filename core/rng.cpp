// core/rng.cpp — random tensor factories over Philox (one value per element index).
#include "core/rng.h"

#include "core/philox.h"
#include "kernels/cpu/parallel.h"

namespace loom {

namespace {
template <typename F>
Tensor generate(const Shape& shape, DType dtype, Device device, F value_at) {
  Tensor t = Tensor::empty(shape, dtype);
  LOOM_DISPATCH_ALL(dtype, "random", [&] {
    scalar_t* p = t.data<scalar_t>();
    kernels::cpu::parallel_for(t.numel(), kernels::cpu::kElementGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = kernels::cpu::convert<scalar_t>(value_at(i));
    });
  });
  return device.is_cpu() ? t : t.to(device);
}
}  // namespace

Tensor randn(const Shape& shape, Generator& gen, DType dtype, double mean, double std,
             Device device) {
  LOOM_CHECK(is_floating(dtype), "randn: dtype ", dtype_name(dtype), " is not floating");
  const uint64_t seed = gen.seed(), offset = gen.reserve(shape_numel(shape));
  return generate(shape, dtype, device, [=](int64_t i) {
    return mean + std * philox_normal(seed, offset, static_cast<uint64_t>(i));
  });
}

Tensor rand(const Shape& shape, Generator& gen, DType dtype, double lo, double hi, Device device) {
  LOOM_CHECK(is_floating(dtype), "rand: dtype ", dtype_name(dtype), " is not floating");
  const uint64_t seed = gen.seed(), offset = gen.reserve(shape_numel(shape));
  return generate(shape, dtype, device, [=](int64_t i) {
    // uint_to_unit_double is in (0, 1]; 1 − u is in [0, 1).
    return lo + (hi - lo) * (1.0 - uint_to_unit_double(
                                       philox_bits(seed, offset, static_cast<uint64_t>(i))));
  });
}

Tensor randint(const Shape& shape, int64_t lo, int64_t hi, Generator& gen, DType dtype,
               Device device) {
  LOOM_CHECK(hi > lo, "randint: empty range [", lo, ", ", hi, ")");
  const uint64_t seed = gen.seed(), offset = gen.reserve(shape_numel(shape));
  const uint64_t span = static_cast<uint64_t>(hi - lo);
  return generate(shape, dtype, device, [=](int64_t i) {
    const uint64_t r = philox_bits(seed, offset, static_cast<uint64_t>(i));
    return static_cast<double>(lo + static_cast<int64_t>(r % span));
  });
}

}  // namespace loom
