// parallel/cp/ring_attention.h — context parallelism: the sequence split across the cp group
// with causal load balancing, and ring attention over it.
//
// Note [Causal load balancing]: the sequence of T tokens is cut into 2·P chunks of c = T/(2P);
// cp rank r holds chunk r and chunk 2P−1−r (one from the front, the mirrored one from the
// back), so every rank has the same amount of causal work. Its local sequence is those two
// chunks concatenated (2c tokens); positions (learned or RoPE) must be their global indices
// (cp_positions).
//
// Note [Ring attention]: key/value chunks travel around the cp ring (rank r sends to r+1 and
// receives from r−1) with async send/recv, posted before the local block is computed so the
// transfer overlaps it. Each step attends the local queries to the visiting keys
// (kernels/attention_block.h, causal by global position; blocks that are entirely in the future
// are skipped) and merges the partial result with online softmax. Backward recomputes the same
// blocks from the final lse; the visiting key/value chunks travel again together with their
// gradient accumulators, which arrive back at their owner after P hops. Deterministic: the
// merge order is fixed (ring order), independent of timing.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::cp {

// This rank's two chunks of a sequence dimension: x (…, T, …) → (…, 2·T/(2P), …) along `dim`.
// T must divide by 2P (checked). Not differentiable: it shards inputs (ids, targets, positions).
Tensor shard_sequence(const Tensor& x, int64_t dim, int rank, int size);
// Global positions of this rank's local tokens, (2·T/(2P)) i32 (arange(T) when P = 1).
Tensor cp_positions(int64_t seq_len, int rank, int size);

// Causal attention of this rank's local q (B, Hq, 2c, D) against the whole sequence, whose
// keys/values are spread over the group as k, v (B, Hkv, 2c, D) per rank (grouped-query when
// Hq > Hkv). Returns (B, Hq, 2c, D); differentiable in q, k, v. scale 0 → 1/√D. Every member
// of `group` must call it with the same shapes. With a group of one it equals
// ops::causal_attention on chunk-ordered input.
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                      Communicator& group);

}  // namespace loom::parallel::cp
