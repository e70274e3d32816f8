// kernels/dropout.h — inverted dropout with a mask regenerated from Philox, never stored.
//
// Note [Dropout mask]: for a tensor of n elements drawn at generator state (seed, offset), where
// offset came from Generator::reserve(n), element i (row-major, 0 ≤ i < n) is KEPT iff
//     uint_to_unit_float(philox_bits(seed, offset, i)) > static_cast<float>(p)
// (both from core/philox.h; the comparison is in f32). Kept elements are multiplied by
// scale = 1/(1 − p), computed in f64 and rounded once to the tensor's compute type (its dtype
// for f32/f64; f32 for bf16/f16 on CUDA, whose product is then rounded once to the dtype);
// dropped ones are 0.
// Backward applies the same rule to dy, so forward and backward agree without a saved mask, and
// every backend (the CUDA kernel included) must reproduce this rule bit for bit.
//
// Rows form (dropout_rows_*, for sequence, context and data parallelism): a tensor x (B, R, C)
// that holds rows rows[0..R) (each 0 ≤ rows[j] < T) of batch elements [b0, b0 + B) of a
// (B_total, T, C) tensor uses, for its element (b, j, c), the draw of element
// i = ((b0 + b)·T + rows[j])·C + c of the full tensor at the same (seed, offset) (the model's
// streams: Note [Dropout by coordinates] in layers/dropout_key.h): each rank of a split
// sequence or batch drops exactly the elements one process drops in the whole tensor. Keep rule and
// scale are those above, so rows = 0..T−1 (R = T) and b0 = 0 give the plain kernel's result bit for
// bit.
#pragma once

#include <cstdint>

#include "kernels/registry.h"

// y = keep(i) ? x·scale : 0   (see Note [Dropout mask]); 0 ≤ p ≤ 1.
LOOM_DECLARE_KERNEL(dropout_forward, void(const loom::Tensor& x,  // x (n)
                                          double p, uint64_t seed, uint64_t offset,
                                          loom::Tensor& y));  // y (n)
// dx += keep(i) ? dy·scale : 0
LOOM_DECLARE_KERNEL(dropout_backward, void(const loom::Tensor& dy,  // dy (n)
                                           double p, uint64_t seed, uint64_t offset,
                                           loom::Tensor& dx));  // dx (n)

// y (B, R, C) = keep(((b0 + b)·T + rows[j])·C + c) ? x·scale : 0  (rows form of Note [Dropout
// mask]).
LOOM_DECLARE_KERNEL(dropout_rows_forward, void(const loom::Tensor& x,     // x (B, R, C)
                                               const loom::Tensor& rows,  // rows (R) i64 in [0, T)
                                               int64_t total_rows,        // T
                                               int64_t batch_offset,      // b0 ≥ 0
                                               double p, uint64_t seed, uint64_t offset,
                                               loom::Tensor& y));  // y (B, R, C)
// dx (B, R, C) += keep(((b0 + b)·T + rows[j])·C + c) ? dy·scale : 0
LOOM_DECLARE_KERNEL(dropout_rows_backward, void(const loom::Tensor& dy,    // dy (B, R, C)
                                                const loom::Tensor& rows,  // rows (R) i64 in [0, T)
                                                int64_t total_rows,        // T
                                                int64_t batch_offset,      // b0 ≥ 0
                                                double p, uint64_t seed, uint64_t offset,
                                                loom::Tensor& dx));  // dx (B, R, C)
