// kernels/reduce.h — sum over one dimension.
#pragma once

#include "kernels/registry.h"

// x contiguous, read as (outer, n, inner); out contiguous (outer, inner): out = Σ_n x.
// Each output element is summed by one thread in index order: the result does not depend on
// the thread count.
LOOM_DECLARE_KERNEL(sum_dim_forward, void(const loom::Tensor& x, int64_t outer, int64_t n,
                                          int64_t inner, loom::Tensor& out));
