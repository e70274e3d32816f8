// parallel/cp/ring_attention.cpp — load-balanced sharding and ring attention (Notes [Causal load
// balancing] and [Ring attention] in the header).
//
// Buffers: a rank's keys and values travel as one packed tensor kv (4, B, Hkv, c, D) holding
// [k of chunk 0, k of chunk 1, v of chunk 0, v of chunk 1] (a leading-dim slice of a contiguous
// tensor is contiguous, which the block kernels need); in backward their gradients travel
// beside them as dkv with the same layout.
#include "parallel/cp/ring_attention.h"

#include <array>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/autograd.h"
#include "core/checkpoint.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "kernels/attention_block.h"
#include "parallel/comm/ring.h"

namespace loom::parallel::cp {
namespace {

constexpr int kTagKv = 1, kTagDkv = 2;

// Global chunk index of local chunk `which` (0 front, 1 back) on cp rank r of P.
int64_t chunk_index(int r, int p, int which) { return which == 0 ? r : 2 * p - 1 - r; }

Tensor slot(const Tensor& packed, int64_t i) {
  return ops::squeeze(ops::narrow(packed, 0, i, 1), 0);
}

// x (B, H, 2c, D) → packed (2, B, H, c, D) of its two chunks.
Tensor split_chunks(const Tensor& x) {
  const int64_t c = x.size(2) / 2;
  return ops::contiguous(ops::cat(
      {ops::unsqueeze(ops::narrow(x, 2, 0, c), 0), ops::unsqueeze(ops::narrow(x, 2, c, c), 0)}, 0));
}

// The dtype of lse and delta (Note [Attention block kernel contract]): f32 for 16-bit inputs.
DType stats_dtype(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

struct Geometry {
  int p, r;
  int64_t c;
  // Offsets of this rank's query chunks and of the chunks of the kv that came from `src`.
  int64_t q_offset(int which) const { return chunk_index(r, p, which) * c; }
  int64_t k_offset(int src, int which) const { return chunk_index(src, p, which) * c; }
  // Any key of the kv chunk visible to any query of the q chunk?
  bool any_visible(int src, int qw, int kw) const {
    return k_offset(src, kw) <= q_offset(qw) + c - 1;
  }
};

}  // namespace

Tensor shard_sequence(const Tensor& x, int64_t dim, int rank, int size) {
  dim = wrap_dim(dim, x.dim(), "shard_sequence");
  LOOM_CHECK(x.size(dim) % (2 * size) == 0, "shard_sequence: sequence length ", x.size(dim),
             " does not divide into 2·cp = ", 2 * size, " chunks");
  const int64_t c = x.size(dim) / (2 * size);
  autograd::NoGradGuard no_grad;
  return ops::contiguous(ops::cat({ops::narrow(x.detach(), dim, chunk_index(rank, size, 0) * c, c),
                                   ops::narrow(x.detach(), dim, chunk_index(rank, size, 1) * c, c)},
                                  dim));
}

Tensor cp_positions(int64_t seq_len, int rank, int size) {
  if (size == 1) {  // the whole sequence in order, of any length
    std::vector<int32_t> pos(static_cast<size_t>(seq_len));
    std::iota(pos.begin(), pos.end(), 0);
    return Tensor::from_vector(pos, {seq_len});
  }
  LOOM_CHECK(seq_len % (2 * size) == 0, "cp_positions: sequence length ", seq_len,
             " does not divide into 2·cp = ", 2 * size, " chunks");
  const int64_t c = seq_len / (2 * size);
  std::vector<int32_t> pos;
  for (int which = 0; which < 2; ++which) {
    for (int64_t i = 0; i < c; ++i)
      pos.push_back(static_cast<int32_t>(chunk_index(rank, size, which) * c + i));
  }
  return Tensor::from_vector(pos, {2 * c});
}

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                      Communicator& group) {
  const char* op = "ring_attention";
  LOOM_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape() && q.size(2) == k.size(2) &&
                 q.size(2) % 2 == 0 && q.size(0) == k.size(0) && q.size(3) == k.size(3),
             op, ": q (B, Hq, 2c, D) and k, v (B, Hkv, 2c, D) expected, got ", shape_str(q.shape()),
             ", ", shape_str(k.shape()), ", ", shape_str(v.shape()));
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const Geometry geo{group.size(), group.rank(), q.size(2) / 2};
  const int p = geo.p;

  const Shape row_shape{q.size(0), q.size(1), geo.c};
  const DType stats = stats_dtype(q.dtype());
  const Tensor qc = split_chunks(q.detach());  // (2, B, Hq, c, D)
  // Note [Selective recompute] in core/checkpoint.h: kept, the ring's outputs and statistics
  // (a recomputation then sends nothing).
  const std::vector<Tensor> kept = kept_or_computed(KeptOp::kAttention, [&] {
    autograd::NoGradGuard no_grad;
    Tensor kv = ops::contiguous(ops::cat({split_chunks(k.detach()), split_chunks(v.detach())}, 0));
    std::array<Tensor, 2> out, lse;
    for (int w = 0; w < 2; ++w) {
      out[w] = Tensor::zeros(slot(qc, w).shape(), q.dtype(), q.device());
      lse[w] = Tensor::full(row_shape, -INFINITY, stats, q.device());
    }
    Tensor block_out = Tensor::empty(slot(qc, 0).shape(), q.dtype(), q.device());
    Tensor block_lse = Tensor::empty(row_shape, stats, q.device());
    for (int step = 0; step < p; ++step) {
      const int src = (geo.r - step + p) % p;
      Tensor next = step + 1 < p ? Tensor::empty(kv.shape(), kv.dtype(), kv.device()) : Tensor();
      RingStep hop;
      if (next.defined()) hop = ring_step(group, kv, next, kTagKv);
      for (int qw = 0; qw < 2; ++qw) {
        for (int kw = 0; kw < 2; ++kw) {
          if (!geo.any_visible(src, qw, kw)) continue;
          kernels::call_kernel<kernels::attention_block_forward_k>(
              slot(qc, qw), slot(kv, kw), slot(kv, 2 + kw), geo.q_offset(qw), geo.k_offset(src, kw),
              scale, block_out, block_lse);
          kernels::call_kernel<kernels::attention_block_merge_k>(out[qw], lse[qw], block_out,
                                                                 block_lse);
        }
      }
      hop.wait();
      if (next.defined()) kv = next;
    }
    return std::vector<Tensor>{out[0], out[1], lse[0], lse[1]};
  });
  const std::array<Tensor, 2> out{kept[0], kept[1]}, lse{kept[2], kept[3]};
  Tensor result;
  {
    autograd::NoGradGuard no_grad;                            // the node below is the op's record
    result = ops::contiguous(ops::cat({out[0], out[1]}, 2));  // (B, Hq, 2c, D)
  }

  if (autograd::needs_grad({&q, &k, &v})) {
    const Tensor kv_own =
        ops::contiguous(ops::cat({split_chunks(k.detach()), split_chunks(v.detach())}, 0));
    const std::array<Tensor, 2> saved_out = out, saved_lse = lse;
    Communicator* g = &group;
    autograd::record_function(op, {q, k, v}, {&result}, [=](const std::vector<Tensor>& grads) {
      autograd::NoGradGuard ng;
      const Tensor dres = ops::contiguous(grads[0]);
      const Tensor dout = split_chunks(dres);  // (2, B, Hq, c, D)
      std::array<Tensor, 2> delta;
      for (int w = 0; w < 2; ++w) {
        delta[w] = ops::contiguous(ops::sum(
            ops::mul(ops::to_dtype(slot(dout, w), stats), ops::to_dtype(saved_out[w], stats)), -1));
      }
      Tensor dq = Tensor::zeros(qc.shape(), qc.dtype(), qc.device());
      Tensor kv_cur = kv_own;
      Tensor dkv = Tensor::zeros(kv_own.shape(), kv_own.dtype(), kv_own.device());
      for (int step = 0; step < p; ++step) {
        const int src = (geo.r - step + p) % p;
        // The next key/value chunk can travel while this step computes; the gradient
        // accumulator only once this step has added to it.
        Tensor kv_next = step + 1 < p
                             ? Tensor::empty(kv_cur.shape(), kv_cur.dtype(), kv_cur.device())
                             : Tensor();
        RingStep kv_hop;
        if (kv_next.defined()) kv_hop = ring_step(*g, kv_cur, kv_next, kTagKv);
        for (int qw = 0; qw < 2; ++qw) {
          for (int kw = 0; kw < 2; ++kw) {
            if (!geo.any_visible(src, qw, kw)) continue;
            Tensor dqw = slot(dq, qw), dk = slot(dkv, kw), dv = slot(dkv, 2 + kw);
            kernels::call_kernel<kernels::attention_block_backward_k>(
                slot(qc, qw), slot(kv_cur, kw), slot(kv_cur, 2 + kw), saved_lse[qw], delta[qw],
                slot(dout, qw), geo.q_offset(qw), geo.k_offset(src, kw), scale, dqw, dk, dv);
          }
        }
        if (p > 1) {
          Tensor dkv_next = Tensor::empty(dkv.shape(), dkv.dtype(), dkv.device());
          RingStep grad_hop = ring_step(*g, dkv, dkv_next, kTagDkv);
          grad_hop.wait();
          dkv = dkv_next;
        }
        kv_hop.wait();
        if (kv_next.defined()) kv_cur = kv_next;
      }
      // After P hops every gradient accumulator is back with its owner.
      const Tensor dq_full = ops::contiguous(ops::cat({slot(dq, 0), slot(dq, 1)}, 2));
      const Tensor dk_full = ops::contiguous(ops::cat({slot(dkv, 0), slot(dkv, 1)}, 2));
      const Tensor dv_full = ops::contiguous(ops::cat({slot(dkv, 2), slot(dkv, 3)}, 2));
      return std::vector<Tensor>{dq_full, dk_full, dv_full};
    });
  }
  return result;
}

}  // namespace loom::parallel::cp
