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
//   lse (N)         log Σ_{j<vocab_size} exp(logits_rj), computed in double; 0 on ignored rows.
//                   Its dtype is the logits' for f32/f64 and f32 for 16-bit logits.
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
// combines the ranks' lse_local into the global lse and sums target_logit over the group
// (exactly one rank holds each target). The backward, with that global lse (N):
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
