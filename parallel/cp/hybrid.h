// parallel/cp/hybrid.h — hybrid context parallelism (USP, Fang & Zhao 2024; Megatron's
// a2a+p2p): the Ulysses all-to-all over u ranks around ring attention over r ranks, cp = u·r.
//
// Note [Hybrid context parallelism]: the cp group of P = u·r ranks is split in two named groups
// (parallel/mesh.h): cp_ulysses, u consecutive cp ranks, and cp_ring, the r ranks with the same
// index in each Ulysses group; cp rank ρ = j·u + i is member i of Ulysses group j and member j
// of ring i. The layout of tokens is the ordinary one of P (Note [Causal load balancing] in
// parallel/cp/ring_attention.h: rank ρ holds chunks ρ and 2P−1−ρ of 2P), so positions, dropout
// coordinates and the loss do not change. That layout, seen from the rings, is ring attention's
// own at r ranks: Ulysses group j holds fine chunks [j·u, (j+1)·u) and their mirrors, which are
// coarse chunks j and 2r−1−j of 2r (c' = u·c tokens each), and member i holds piece i of the
// first and piece u−1−i of the second — the load-balanced layout of u ranks over those two
// coarse chunks. So Ulysses' exchange over the u group (Note [Ulysses] in parallel/cp/ulysses.h,
// kv heads split or repeated as there) gives each rank Hq/u heads of coarse chunks j and
// 2r−1−j in order, which is exactly ring rank j's input; ring attention over cp_ring runs on it
// unchanged, and the output goes back by the inverse all-to-all. Per attention call and rank,
// forward moves (u−1)/u of q, k, v and out (all-to-alls) and the gathered kv, of the size of
// this rank's own k and v (repeated), r−1 times around the ring; backward the same all-to-alls
// of the gradients and kv r−1 times plus its gradient r times. u = P is Ulysses, u = 1 ring.
// Needs Hq % u == 0 and Hkv % u == 0 or u % Hkv == 0 (parallel.cp_ulysses). Like ring
// attention it has no per-row first key, so packed documents and a sliding window shorter than
// the sequence are refused (by the config, naming parallel.cp_attention).
#pragma once

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::cp {

// Causal attention of this rank's local q (B, Hq, 2c, D), k, v (B, Hkv, 2c, D) (its chunks of
// the cp group ulysses × ring) over the whole sequence (Note [Hybrid context parallelism]).
// Returns (B, Hq, 2c, D); differentiable in q, k, v. scale 0 → 1/√D. Every member of both
// groups calls it with the same shapes.
Tensor hybrid_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                        Communicator& ulysses, Communicator& ring);

}  // namespace loom::parallel::cp
