// parallel/dp/sparse_rows.h — the average over a data-parallel group of a 2-d gradient most of
// whose rows are zero (an embedding table's lookup gradient: a batch of T tokens touches at most
// T of its rows), sending only the rows some rank has non-zero (Note [Early contributions and
// sparse rows] in parallel/dp/data_parallel.h says when DataParallel uses it). Host tensors only:
// the row count must be known on the host to size the packed buffer, which on a GPU would cost a
// device synchronisation per step (Note [Device step] in train/train_step.cpp).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::dp {

struct SparseRowsResult {
  bool sparse = false;    // false: the union was too large and g was all-reduced whole
  int64_t rows_sent = 0;  // rows in the union (every row when not sparse)
};

// g (rows, cols), contiguous, f32 or f64, on the host: g ← the average of every member's g.
// Every member calls it (a collective over `group`: two operations, waited here): an all-reduce
// of a per-row "non-zero here" mask (rows f32), then of the union's rows packed together — or,
// when the union holds more than max_fraction of the rows, of g whole. Each element is the same
// average of the same values as a whole all-reduce; rows no member touched stay zero.
SparseRowsResult all_reduce_rows_avg(Tensor& g, Communicator& group, double max_fraction = 0.5);

}  // namespace loom::parallel::dp
