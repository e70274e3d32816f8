// kernels/embedding.h — embedding lookup (gather rows) and its backward (scatter-add rows).
// ids are contiguous, of an integer dtype (i32, i64, u16, u32), read as (N); weight/dweight are
// contiguous (V, C); out/dout are contiguous (N, C). Both kernels reject an id outside [0, V)
// with an error naming the id, its position and V — unless ids_checked says the caller has
// already checked them (on the host before uploading them, or in the forward of the same ids):
// then a device kernel skips its check, whose error needs a host synchronisation per call, and
// an id outside [0, V) is undefined (memory-safe: no row is read or written out of bounds). The
// CPU kernels always check (it costs nothing there). The backward kernel accumulates.
#pragma once

#include <cstdint>

#include "kernels/registry.h"

namespace loom::kernels {

// The check both CPU kernels make, and ops::embedding makes on host ids before uploading them:
// every id in [0, vocab), else the error naming the first bad id, its position and V.
template <typename I>
void check_embedding_ids(const I* ids, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    LOOM_CHECK(id >= 0 && id < vocab, "embedding: id ", id, " at position ", i,
               " is out of range for a vocabulary of V=", vocab);
  }
}

}  // namespace loom::kernels

// out[n, :] = weight[ids[n], :]
LOOM_DECLARE_KERNEL(embedding_forward, void(const loom::Tensor& ids,     // ids (N)
                                            const loom::Tensor& weight,  // weight (V, C)
                                            loom::Tensor& out,           // out (N, C)
                                            bool ids_checked));
// dweight[v, :] += Σ_{n : ids[n] = v} dout[n, :], each row summed in token order (deterministic,
// no atomics).
LOOM_DECLARE_KERNEL(embedding_backward, void(const loom::Tensor& ids,   // ids (N)
                                             const loom::Tensor& dout,  // dout (N, C)
                                             loom::Tensor& dweight,     // dweight (V, C)
                                             bool ids_checked));

// The rows of a vocab-parallel embedding shard (parallel/tp/layers.cpp), for every id n:
//   local_ids[n] = ids[n] − vocab_start, mask[n] = 1  if ids[n] ∈ [vocab_start, vocab_start + rows)
//   local_ids[n] = 0,                    mask[n] = 0  otherwise
// so that embedding(local_ids, shard) · mask holds this rank's part of the lookup. ids (N) and
// local_ids (N, i64) and mask (N, any float dtype the backend takes) are contiguous; no id is an
// error (ids outside the shard are simply masked).
LOOM_DECLARE_KERNEL(vocab_parallel_ids,
                    void(const loom::Tensor& ids, int64_t vocab_start, int64_t rows,
                         loom::Tensor& local_ids, loom::Tensor& mask));

namespace loom::kernels {

// vocab_parallel_ids' argument checks, shared by every backend (host only, reads no data).
inline void check_vocab_parallel_ids_args(const Tensor& ids, const Tensor& local_ids,
                                          const Tensor& mask) {
  const int64_t n = ids.numel();
  LOOM_CHECK(ids.is_contiguous() && local_ids.is_contiguous() && mask.is_contiguous() &&
                 local_ids.numel() == n && mask.numel() == n && local_ids.dtype() == DType::kI64,
             "vocab_parallel_ids: ids (", n, "), local_ids (", n, ", i64) and mask (", n,
             ") must be contiguous, got ", shape_str(ids.shape()), ", ",
             shape_str(local_ids.shape()), " ", dtype_name(local_ids.dtype()), ", ",
             shape_str(mask.shape()));
}

}  // namespace loom::kernels
