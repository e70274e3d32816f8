// core/ops/dropout.h — differentiable inverted dropout. The mask is a pure function of the
// generator state (Note [Dropout mask] in kernels/dropout.h) and is regenerated in backward,
// never stored.
#pragma once

#include "core/rng.h"
#include "core/tensor.h"

namespace loom::ops {

// Returns x itself when !training or p == 0. Otherwise reserves gen.reserve(x.numel()) counters
// at offset o and, with u_i = uint_to_unit_float(philox_bits(gen.seed(), o, i)) for element i in
// row-major order, keeps element i iff u_i > float(p), scaling kept values by 1/(1 − p) and
// zeroing the rest. 0 ≤ p ≤ 1 (p = 1 gives zeros). The same rule holds on every device.
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training);

}  // namespace loom::ops
