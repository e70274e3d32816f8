// layers/init.h — in-place parameter initialisers (normal, constant, zeroed rows). They write
// through ops::copy_ with recording off, so they never add autograd history; the random ones
// draw from the Generator passed in (there is no default generator).
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "core/tensor.h"

namespace loom::init {

// p ← N(0, std²), drawn in p's dtype from `gen`.
void normal_(const Tensor& p, Generator& gen, double std);
// p ← value everywhere.
void fill_(const Tensor& p, double value);
// Rows [begin, p.size(0)) of a 2-d p ← 0 (the padded vocabulary rows of embedding tables).
void zero_rows_from_(const Tensor& p, int64_t begin);

}  // namespace loom::init
