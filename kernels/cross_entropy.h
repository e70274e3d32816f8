// kernels/cross_entropy.h — fused softmax cross-entropy kernels. The forward keeps per-row
// log-sum-exp and loss only (never the probabilities); the backward recomputes each
// probability from the saved lse and writes the logits' gradient in one pass. Kernels allocate
// nothing they return, and their results do not depend on the thread count.
#pragma once

#include "kernels/registry.h"

// Note [Cross-entropy kernel contract]:
//   logits (N, Vp)  contiguous float. Columns j >= vocab_size (0 < vocab_size <= Vp) are
//                   padding: left out of the softmax, and given no gradient.
//   targets (N)     contiguous integer (i32, i64, u16, u32), compared with ignore_index as
//                   int64. A target that is not ignore_index must lie in [0, vocab_size).
//   lse (N)         log Σ_{j<vocab_size} exp(logits_rj); 0 on ignored rows. Its dtype is the
//                   logits' for f32/f64 and f32 for 16-bit logits. The CPU computes it in double;
//                   CUDA takes the row's max and Σ exp in lse's dtype and forms lse and loss from
//                   them in double.
//   loss (N)        lse_r − logits_{r,t_r}; 0 on ignored rows. Same dtype as lse.
// Backward, per row r whose target is not ignored, over columns j < vocab_size:
//   dlogits_rj += (exp(logits_rj − lse_r) − [j == t_r]) · dloss · grad_scale
// where dloss is a 0-d tensor of lse's dtype (read where it lives, so no host sync) and
// grad_scale a host factor (1/count for the mean over non-ignored rows). Ignored rows and
// padding columns are left untouched; dlogits (N, Vp) is contiguous and ACCUMULATED into.

LOOM_DECLARE_KERNEL(cross_entropy_forward,
                    void(const loom::Tensor& logits, const loom::Tensor& targets,
                         int64_t ignore_index, int64_t vocab_size, loom::Tensor& loss,
                         loom::Tensor& lse));
LOOM_DECLARE_KERNEL(cross_entropy_backward,
                    void(const loom::Tensor& logits, const loom::Tensor& targets,
                         const loom::Tensor& lse, const loom::Tensor& dloss, double grad_scale,
                         int64_t ignore_index, int64_t vocab_size, loom::Tensor& dlogits));

// Note [Vocab-parallel cross-entropy kernels]: the same loss when the vocabulary is split
// across a tensor-parallel group. This rank holds logits (N, Vl) for global columns
// [vocab_start, vocab_start + Vl), of which the first vocab_valid (≥ 1) are real vocabulary;
// targets (N) are GLOBAL ids (or ignore_index). The forward writes, per non-ignored row,
//   lse_local_r    = log Σ_{j<vocab_valid} exp(logits_rj)       (in double, stored as lse dtype)
//   target_logit_r = logits_{r, t_r − vocab_start} if t_r falls in this rank's real columns, else 0
// and 0 to both on ignored rows; dtypes as lse in Note [Cross-entropy kernel contract]. The op
// sums target_logit over the group (exactly one rank holds each target) and combines the ranks'
// lse_local into the global lse (vocab_parallel_lse_combine below). The backward, with that
// global lse (N):
//   dlogits_rj += (exp(logits_rj − lse_r) − [vocab_start + j == t_r]) · dloss · grad_scale
// for non-ignored rows and j < vocab_valid; other entries are untouched (ACCUMULATED, like
// cross_entropy_backward).
LOOM_DECLARE_KERNEL(vocab_parallel_ce_forward,
                    void(const loom::Tensor& logits, const loom::Tensor& targets,
                         int64_t ignore_index, int64_t vocab_start, int64_t vocab_valid,
                         loom::Tensor& lse_local, loom::Tensor& target_logit));
LOOM_DECLARE_KERNEL(vocab_parallel_ce_backward,
                    void(const loom::Tensor& logits, const loom::Tensor& targets,
                         const loom::Tensor& lse, const loom::Tensor& dloss, double grad_scale,
                         int64_t ignore_index, int64_t vocab_start, int64_t vocab_valid,
                         loom::Tensor& dlogits));

// Note [Vocab-parallel lse combine]: the step after the all-gather of the group's lse_local and
// the all-reduce of target_logit, on the device that holds them (no host read):
//   lses (g, N)       the group's lse_local in rank order (contiguous, lse dtype)
//   target_logit (N)  summed over the group (lse dtype); targets (N) as above
// per row r whose target is not ignore_index, in double with the ranks in order:
//   m = max_q lses_qr,  lse_r = m + log Σ_q exp(lses_qr − m),  row_loss_r = lse_r − target_logit_r
// and lse_r = row_loss_r = 0 on ignored rows. lse (N) has lses' dtype, row_loss (N) is f64.
// Then, over the non-ignored rows (count of them), in row order on the CPU and in a fixed order
// on a device: loss () = Σ row_loss / count (computed in double, stored in lses' dtype; 0 when
// count is 0) and inv_count () f64 = 1/count (0 when count is 0), the factor the backward
// applies to dloss. The CPU kernel rejects a target outside [0, vocab_size) that is not
// ignore_index; a device kernel cannot throw, so there such a row gets NaN lse and row_loss
// (the loss is NaN) and still counts.
LOOM_DECLARE_KERNEL(vocab_parallel_lse_combine,
                    void(const loom::Tensor& lses, const loom::Tensor& target_logit,
                         const loom::Tensor& targets, int64_t ignore_index, int64_t vocab_size,
                         loom::Tensor& lse, loom::Tensor& row_loss, loom::Tensor& loss,
                         loom::Tensor& inv_count));
