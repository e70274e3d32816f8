// kernels/reduce.h — sum over one dimension.
#pragma once

#include "kernels/registry.h"

// x contiguous, read as (outer, n, inner); out contiguous (outer, inner): out = Σ_n x.
// Each output element is summed by one thread in index order: the result does not depend on
// the thread count.
LOOM_DECLARE_KERNEL(sum_dim_forward, void(const loom::Tensor& x, int64_t outer, int64_t n,
                                          int64_t inner, loom::Tensor& out));
// out (0-d f64) = Σ x² over all elements of contiguous x, accumulated in double over fixed-size
// chunks whose partial sums are added in chunk order (thread-count independent).
LOOM_DECLARE_KERNEL(sum_squares_forward, void(const loom::Tensor& x, loom::Tensor& out));
