// parallel/cp/ulysses.h — DeepSpeed-Ulysses attention over the cp group: an all-to-all trades
// the sequence split for a head split, each rank attends whole sequences for its share of the
// heads, and an all-to-all trades back.
//
// Note [Ulysses]: the ranks hold their load-balanced chunks (Note [Causal load balancing] in
// parallel/cp/ring_attention.h) of every head, q (B, Hq, L, D) with L = 2c. An all-to-all over
// the cp group of P ranks sends rank j the heads [j·Hq/P, (j+1)·Hq/P) of this rank's tokens; the
// received tokens are put in global order (chunk k of 2P comes from rank k's first half for
// k < P, from rank 2P−1−k's second half otherwise), so each rank holds (B, Hq/P, T, D) and runs
// the ordinary causal attention kernel over the whole sequence — with each row's first key
// (packed documents, a sliding window: Note [Packed documents] in kernels/attention.h) as it is,
// since every row sees its whole sequence. The output goes back the same way. Keys and values:
// with Hkv a multiple of P each rank takes Hkv/P of them (the ones its query heads read); with
// fewer kv heads than ranks (P a multiple of Hkv) each kv head is repeated P/Hkv times first, so
// rank j receives kv head j·Hkv/P, the one its query heads read (the repeat's backward sums the
// copies' gradients). Per attention call and rank, forward moves (P−1)/P of q, k, v (repeated)
// and out, and backward the same of their gradients, as four all-to-alls each way; ring
// attention moves k and v P−1 times (parallel/cp/ring_attention.h). Needs Hq % P == 0, and
// Hkv % P == 0 or P % Hkv == 0 (the config names model.n_head, model.n_kv_head).
#pragma once

#include <functional>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::cp {

// Causal attention of this rank's local q (B, Hq, L, D), k, v (B, Hkv, L, D) (its load-balanced
// chunks) over the whole sequence, through the head split of Note [Ulysses]; first_keys (T) i32
// for the whole sequence in global order (each row's first key), or undefined. Returns (B, Hq,
// L, D); differentiable in q, k, v. scale 0 → 1/√D. With a group of one it is
// ops::causal_attention.
Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                         Communicator& group, const Tensor& first_keys = {});

// Whether ulysses_attention can split hq query and hkv kv heads over p ranks.
bool ulysses_divides(int64_t hq, int64_t hkv, int64_t p);

// The exchange of Note [Ulysses] around any attention: `attend` gets this rank's heads of the
// group's tokens, q (B, Hq/P, 2P·c, D) and k, v (B, max(Hkv/P, 1), 2P·c, D), the group's 2P
// chunks in order, and returns (B, Hq/P, 2P·c, D) in that order, which goes back to (B, Hq, L,
// D) of this rank's tokens. With a group of one, `attend` gets q, k, v themselves.
using GatheredAttention = std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v)>;
Tensor ulysses_around(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& group,
                      const GatheredAttention& attend);

}  // namespace loom::parallel::cp
