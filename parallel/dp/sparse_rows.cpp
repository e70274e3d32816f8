// parallel/dp/sparse_rows.cpp — all_reduce_rows_avg (see parallel/dp/sparse_rows.h).
#include "parallel/dp/sparse_rows.h"

#include <cstring>
#include <vector>

namespace loom::parallel::dp {

namespace {

template <typename T>
SparseRowsResult rows_avg(Tensor& g, Communicator& group, double max_fraction) {
  const int64_t rows = g.shape()[0], cols = g.shape()[1];
  T* data = g.data<T>();
  Tensor mask = Tensor::zeros({rows}, DType::kF32);
  float* m = mask.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = data + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      if (row[c] != T(0)) {
        m[r] = 1.0f;
        break;
      }
    }
  }
  group.all_reduce(mask, ReduceOp::kSum);
  std::vector<int64_t> used;
  for (int64_t r = 0; r < rows; ++r) {
    if (m[r] > 0.0f) used.push_back(r);
  }
  const int64_t n = static_cast<int64_t>(used.size());
  if (static_cast<double>(n) > max_fraction * static_cast<double>(rows)) {
    group.all_reduce(g.view({rows * cols}), ReduceOp::kAvg);
    return {false, rows};
  }
  if (n == 0) return {true, 0};
  Tensor packed = Tensor::empty({n * cols}, g.dtype());
  T* p = packed.data<T>();
  const size_t row_bytes = static_cast<size_t>(cols) * sizeof(T);
  for (int64_t k = 0; k < n; ++k) std::memcpy(p + k * cols, data + used[k] * cols, row_bytes);
  group.all_reduce(packed, ReduceOp::kAvg);
  for (int64_t k = 0; k < n; ++k) std::memcpy(data + used[k] * cols, p + k * cols, row_bytes);
  return {true, n};
}

}  // namespace

SparseRowsResult all_reduce_rows_avg(Tensor& g, Communicator& group, double max_fraction) {
  LOOM_CHECK(g.dim() == 2 && g.is_contiguous() && g.device().is_cpu(),
             "all_reduce_rows_avg: needs a contiguous 2-d host tensor, got ", shape_str(g.shape()),
             " on ", g.device().str());
  if (g.dtype() == DType::kF32) return rows_avg<float>(g, group, max_fraction);
  LOOM_CHECK(g.dtype() == DType::kF64, "all_reduce_rows_avg: f32 or f64, got ",
             dtype_name(g.dtype()));
  return rows_avg<double>(g, group, max_fraction);
}

}  // namespace loom::parallel::dp
