// core/ops/dropout.h — differentiable inverted dropout. The mask is a pure function of a Philox
// stream (Note [Dropout mask] in kernels/dropout.h) — a generator's next reservation, or an
// explicit (seed, offset) — and is regenerated in backward, never stored.
#pragma once

#include "core/rng.h"
#include "core/tensor.h"

namespace loom::ops {

// Returns x itself when !training or p == 0. Otherwise reserves gen.reserve(x.numel()) counters
// at offset o and, with u_i = uint_to_unit_float(philox_bits(gen.seed(), o, i)) for element i in
// row-major order, keeps element i iff u_i > float(p), scaling kept values by 1/(1 − p) and
// zeroing the rest. 0 ≤ p ≤ 1 (p = 1 gives zeros). The same rule holds on every device.
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training);
// The same rule at an explicit Philox stream (seed, offset), nothing reserved: for masks that
// are a function of where the tensor sits rather than of a generator's history (Note [Dropout
// by coordinates] in layers/dropout_key.h).
Tensor dropout_at(const Tensor& x, double p, uint64_t seed, uint64_t offset, bool training);

// Dropout of x (B, R, C), the rows `rows` (R) (integer, each in [0, total_rows)) of batch
// elements [batch_offset, batch_offset + B) of a (·, total_rows, C) tensor, with that whole
// tensor's mask at the Philox stream (seed, offset) (the rows form of Note [Dropout mask]):
// element (b, j, c) gets the fate of whole-tensor element
// ((batch_offset + b)·total_rows + rows[j])·C + c, as ops::dropout_at of the whole tensor at the
// same stream gives it. So the ranks of a sequence-, context- or data-parallel split drop what
// one process drops (Note [Dropout by coordinates] in layers/dropout_key.h). Returns x itself
// when !training or p == 0. Differentiable in x; the mask is regenerated in backward.
Tensor dropout_rows_at(const Tensor& x, double p, uint64_t seed, uint64_t offset, bool training,
                       const Tensor& rows, int64_t total_rows, int64_t batch_offset = 0);

}  // namespace loom::ops
