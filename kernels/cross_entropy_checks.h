// kernels/cross_entropy_checks.h — the argument checks the cross-entropy kernels of every
// backend share (kernels/cross_entropy.h): shapes, row buffers, vocabulary shards and the
// vocab-parallel combine's arguments. Host code only, reading no tensor data; each error names
// the kernel and the argument. The backends keep only what differs (e.g. the CPU widens and
// range-checks the targets it reads; the CUDA row buffers are f32 for 16-bit logits).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace loom::kernels {

// logits (N, Vp) and targets (N) contiguous; 1 ≤ vocab_size ≤ Vp.
inline void check_logits_targets(const Tensor& logits, const Tensor& targets, int64_t vocab_size,
                                 const char* name) {
  LOOM_CHECK(logits.dim() == 2 && logits.is_contiguous(), name,
             ": logits must be contiguous (N, Vp), got ", shape_str(logits.shape()));
  LOOM_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0) && targets.is_contiguous(),
             name, ": targets must be contiguous (", logits.size(0), "), got ",
             shape_str(targets.shape()));
  LOOM_CHECK(vocab_size > 0 && vocab_size <= logits.size(1), name, ": vocab_size ", vocab_size,
             " must be in [1, ", logits.size(1), "]");
}

// A per-row buffer `what`: contiguous (rows) of dtype `want`.
inline void check_row_buffer(const Tensor& t, int64_t rows, DType want, const char* name,
                             const char* what) {
  LOOM_CHECK(t.dim() == 1 && t.size(0) == rows && t.is_contiguous() && t.dtype() == want, name,
             ": ", what, " must be contiguous (", rows, ") ", dtype_name(want), ", got ",
             shape_str(t.shape()), " ", dtype_name(t.dtype()));
}

// Backward: dloss one element in lse's dtype; dlogits contiguous, shaped and typed like logits.
inline void check_backward_args(const Tensor& logits, const Tensor& lse, const Tensor& dloss,
                                const Tensor& dlogits, const char* name) {
  LOOM_CHECK(dloss.numel() == 1 && dloss.dtype() == lse.dtype(), name, ": dloss must be one ",
             dtype_name(lse.dtype()), " element, got ", shape_str(dloss.shape()), " ",
             dtype_name(dloss.dtype()));
  LOOM_CHECK(dlogits.shape() == logits.shape() && dlogits.dtype() == logits.dtype() &&
                 dlogits.is_contiguous(),
             name, ": dlogits must be contiguous like logits ", shape_str(logits.shape()));
}

// [vocab_start, vocab_start + vocab_valid) real columns of a shard of logits.size(1) columns.
inline void check_shard(const Tensor& logits, int64_t vocab_start, int64_t vocab_valid,
                        const char* name) {
  LOOM_CHECK(vocab_start >= 0 && vocab_valid >= 1 && vocab_valid <= logits.size(1), name,
             ": vocab_start ", vocab_start, " / vocab_valid ", vocab_valid,
             " do not describe a shard of ", logits.size(1), " columns");
}

// vocab_parallel_lse_combine: lses (g, N) with g ≥ 1; target_logit, lse (N) in lses' dtype;
// row_loss (N) f64; targets (N); loss one element in lses' dtype; inv_count one f64 element.
inline void check_lse_combine_args(const Tensor& lses, const Tensor& target_logit,
                                   const Tensor& targets, int64_t vocab_size, const Tensor& lse,
                                   const Tensor& row_loss, const Tensor& loss,
                                   const Tensor& inv_count, const char* name) {
  LOOM_CHECK(lses.dim() == 2 && lses.size(0) >= 1 && lses.is_contiguous(), name,
             ": lses must be contiguous (g, N) with g >= 1, got ", shape_str(lses.shape()));
  const int64_t n = lses.size(1);
  const DType dt = lses.dtype();
  check_row_buffer(target_logit, n, dt, name, "target_logit");
  check_row_buffer(lse, n, dt, name, "lse");
  check_row_buffer(row_loss, n, DType::kF64, name, "row_loss");
  LOOM_CHECK(targets.dim() == 1 && targets.size(0) == n && targets.is_contiguous(), name,
             ": targets must be contiguous (", n, "), got ", shape_str(targets.shape()));
  LOOM_CHECK(loss.numel() == 1 && loss.dtype() == dt, name, ": loss must be one ", dtype_name(dt),
             " element");
  LOOM_CHECK(inv_count.numel() == 1 && inv_count.dtype() == DType::kF64, name,
             ": inv_count must be one f64 element");
  LOOM_CHECK(vocab_size > 0, name, ": vocab_size ", vocab_size, " must be positive");
}

}  // namespace loom::kernels
