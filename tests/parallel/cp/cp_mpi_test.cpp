// tests/parallel/cp/cp_mpi_test.cpp — context parallelism under mpirun with the whole world as the
// cp group (2 or 4 ranks): load-balanced sharding and global positions, and ring attention
// (forward output and the q, k, v gradients) against ops::causal_attention of the whole
// sequence computed locally on every rank, with multi-head and grouped-query heads. Ring
// attention adds the same terms as the full kernel but merges them block by block (online
// softmax), so results agree to f32 rounding: checked at 2e-5 relative. Ulysses attention
// (parallel/cp/ulysses.h) the same way, with kv heads fewer than ranks and a sliding window;
// and hybrid attention (parallel/cp/hybrid.h: Ulysses over cp_ulysses around ring attention over
// cp_ring), u2×r2 at 4 ranks and the degenerate splits u = P and u = 1 at both sizes.
//
// loom-mpi-test: ranks 2 4
// loom-multihost-test: 2x2
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops/attention.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "core/rng.h"
#include "parallel/cp/hybrid.h"
#include "parallel/cp/ring_attention.h"
#include "parallel/cp/ulysses.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel {
namespace {

ParallelContext cp_world() {
  ParallelOptions o;
  o.shape = {.dp = 1, .pp = 1, .cp = testing::world_size(), .tp = 1};
  o.comm_timeout_s = testing::kTestCommTimeoutS;
  return ParallelContext::create(o);
}

using testing::rel_err;

Tensor shared_rand(uint64_t salt, const Shape& shape) {
  Generator gen(salt);
  return randn(shape, gen, DType::kF32);
}

Tensor leaf(const Tensor& t) {
  Tensor l = ops::clone(t);
  l.set_requires_grad(true);
  return l;
}

TEST(ContextParallel, ShardsAreTheMirroredChunksWithGlobalPositions) {
  ParallelContext ctx = cp_world();
  const int r = ctx.cp().rank(), p = ctx.cp().size();
  const int64_t T = 2 * p * 3;
  std::vector<int32_t> all(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) all[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const Tensor seq = Tensor::from_vector(all, {1, T});
  const std::vector<double> mine = cp::shard_sequence(seq, 1, r, p).to_vector();
  const std::vector<double> pos = cp::cp_positions(T, r, p).to_vector();
  ASSERT_EQ(mine.size(), 6u);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(mine[static_cast<size_t>(i)], r * 3 + i);
    EXPECT_EQ(mine[static_cast<size_t>(3 + i)], (2 * p - 1 - r) * 3 + i);
  }
  EXPECT_EQ(mine, pos);
  EXPECT_THROW(cp::shard_sequence(Tensor::zeros({1, 2 * p + 1}), 1, r, p), Error);
}

void check_ring(int64_t hq, int64_t hkv, int64_t c) {
  ParallelContext ctx = cp_world();
  Communicator& g = ctx.cp();
  const int r = g.rank(), p = g.size();
  const int64_t B = 2, T = 2 * p * c, D = 8;
  const Tensor q = shared_rand(1, {B, hq, T, D}), k = shared_rand(2, {B, hkv, T, D});
  const Tensor v = shared_rand(3, {B, hkv, T, D}), w = shared_rand(4, {B, hq, T, D});
  Tensor fq = leaf(q), fk = leaf(k), fv = leaf(v);
  Tensor full = ops::causal_attention(fq, fk, fv);
  autograd::backward(ops::sum(ops::mul(full, w)));

  auto shard = [&](const Tensor& x) { return cp::shard_sequence(x, 2, r, p); };
  Tensor lq = leaf(shard(q)), lk = leaf(shard(k)), lv = leaf(shard(v));
  Tensor out = cp::ring_attention(lq, lk, lv, 0.0, g);
  EXPECT_LT(rel_err(shard(full.detach()), out), 2e-5);
  autograd::backward(ops::sum(ops::mul(out, shard(w))));
  EXPECT_LT(rel_err(shard(fq.grad()), lq.grad()), 2e-5);
  EXPECT_LT(rel_err(shard(fk.grad()), lk.grad()), 2e-5);
  EXPECT_LT(rel_err(shard(fv.grad()), lv.grad()), 2e-5);
}

// Ulysses (Note [Ulysses] in parallel/cp/ulysses.h): the same comparison, also with kv heads
// fewer than ranks (repeated) and a sliding window's first keys; the head split runs the full
// kernel on whole sequences, so the agreement is to f32 rounding of the same sums.
void check_ulysses(int64_t hq, int64_t hkv, int64_t c, int64_t window) {
  ParallelContext ctx = cp_world();
  Communicator& g = ctx.cp();
  const int r = g.rank(), p = g.size();
  SCOPED_TRACE("ulysses hq " + std::to_string(hq) + " hkv " + std::to_string(hkv) + " window " +
               std::to_string(window));
  const int64_t B = 2, T = 2 * p * c, D = 8;
  Tensor first;
  if (window > 0) {
    std::vector<int32_t> f(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i)
      f[static_cast<size_t>(i)] = static_cast<int32_t>(std::max<int64_t>(0, i - window + 1));
    first = Tensor::from_vector(f, {T});
  }
  const Tensor q = shared_rand(11, {B, hq, T, D}), k = shared_rand(12, {B, hkv, T, D});
  const Tensor v = shared_rand(13, {B, hkv, T, D}), w = shared_rand(14, {B, hq, T, D});
  Tensor fq = leaf(q), fk = leaf(k), fv = leaf(v);
  Tensor full = ops::causal_attention(fq, fk, fv, 0.0, first);
  autograd::backward(ops::sum(ops::mul(full, w)));

  auto shard = [&](const Tensor& x) { return cp::shard_sequence(x, 2, r, p); };
  Tensor lq = leaf(shard(q)), lk = leaf(shard(k)), lv = leaf(shard(v));
  Tensor out = cp::ulysses_attention(lq, lk, lv, 0.0, g, first);
  EXPECT_LT(rel_err(shard(full.detach()), out), 2e-5);
  autograd::backward(ops::sum(ops::mul(out, shard(w))));
  EXPECT_LT(rel_err(shard(fq.grad()), lq.grad()), 2e-5);
  EXPECT_LT(rel_err(shard(fk.grad()), lk.grad()), 2e-5);
  EXPECT_LT(rel_err(shard(fv.grad()), lv.grad()), 2e-5);
}

TEST(ContextParallel, UlyssesMatchesFullCausalAttention) {
  const int p = testing::world_size();
  check_ulysses(2 * p, 2 * p, 3, 0);  // two heads per rank
  check_ulysses(2 * p, p, 2, 0);      // grouped-query, one kv head per rank
  check_ulysses(p, 1, 1, 0);          // one kv head for every rank: repeated P times
  check_ulysses(2 * p, 2, 3, 0);      // P a multiple of Hkv = 2 (at 2 ranks: one each)
  check_ulysses(2 * p, 2 * p, 4, 3);  // a 3-token sliding window over 8P tokens
}

// Hybrid (Note [Hybrid context parallelism] in parallel/cp/hybrid.h): the cp group split into u
// Ulysses ranks × P/u rings, each rank keeping its ordinary load-balanced chunks; the ring adds
// the blocks of its coarse chunks by online softmax, so the agreement is to f32 rounding.
void check_hybrid(int u, int64_t hq, int64_t hkv, int64_t c) {
  ParallelOptions o;
  o.shape = {.dp = 1, .pp = 1, .cp = testing::world_size(), .tp = 1};
  o.cp_ulysses = u;
  o.comm_timeout_s = testing::kTestCommTimeoutS;
  ParallelContext ctx = ParallelContext::create(o);
  Communicator &g = ctx.cp(), &ulysses = ctx.group({kAxisCpUlysses}),
               &ring = ctx.group({kAxisCpRing});
  const int r = g.rank(), p = g.size();
  SCOPED_TRACE("hybrid u " + std::to_string(u) + " hq " + std::to_string(hq) + " hkv " +
               std::to_string(hkv) + " c " + std::to_string(c));
  // cp rank j·u + i: member i of Ulysses group j, member j of ring i.
  ASSERT_EQ(ulysses.size(), u);
  ASSERT_EQ(ring.size(), p / u);
  EXPECT_EQ(ulysses.rank(), r % u);
  EXPECT_EQ(ring.rank(), r / u);
  const int64_t B = 2, T = 2 * p * c, D = 8;
  const Tensor q = shared_rand(21, {B, hq, T, D}), k = shared_rand(22, {B, hkv, T, D});
  const Tensor v = shared_rand(23, {B, hkv, T, D}), w = shared_rand(24, {B, hq, T, D});
  Tensor fq = leaf(q), fk = leaf(k), fv = leaf(v);
  Tensor full = ops::causal_attention(fq, fk, fv);
  autograd::backward(ops::sum(ops::mul(full, w)));

  auto shard = [&](const Tensor& x) { return cp::shard_sequence(x, 2, r, p); };
  Tensor lq = leaf(shard(q)), lk = leaf(shard(k)), lv = leaf(shard(v));
  Tensor out = cp::hybrid_attention(lq, lk, lv, 0.0, ulysses, ring);
  EXPECT_LT(rel_err(shard(full.detach()), out), 2e-5);
  autograd::backward(ops::sum(ops::mul(out, shard(w))));
  EXPECT_LT(rel_err(shard(fq.grad()), lq.grad()), 2e-5);
  EXPECT_LT(rel_err(shard(fk.grad()), lk.grad()), 2e-5);
  EXPECT_LT(rel_err(shard(fv.grad()), lv.grad()), 2e-5);
}

TEST(ContextParallel, HybridMatchesFullCausalAttention) {
  const int p = testing::world_size();
  // At 4 ranks u2 × r2: two Ulysses pairs, two rings of two.
  if (p == 4) {
    check_hybrid(2, 4, 4, 3);  // two heads per Ulysses rank
    check_hybrid(2, 4, 2, 2);  // grouped-query: one kv head per Ulysses rank, two q heads
    check_hybrid(2, 2, 1, 2);  // one kv head repeated over the 2 Ulysses ranks
    check_hybrid(2, 2, 2, 1);  // one-token fine chunks
  }
  check_hybrid(p, 2 * p, p, 2);  // one ring rank: Ulysses over the whole group
  check_hybrid(1, 4, 2, 3);      // one Ulysses rank: ring attention
}

TEST(ContextParallel, RingAttentionMatchesFullCausalAttention) { check_ring(4, 4, 3); }
TEST(ContextParallel, RingAttentionWithGroupedQueryHeads) { check_ring(4, 2, 5); }
TEST(ContextParallel, RingAttentionWithOneTokenChunks) { check_ring(2, 1, 1); }

}  // namespace
}  // namespace loom::parallel
