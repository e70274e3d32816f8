// parallel/cp/ulysses.cpp — ulysses_attention (see parallel/cp/ulysses.h, Note [Ulysses]).
#include "parallel/cp/ulysses.h"

#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/attention.h"
#include "core/ops/view.h"

namespace loom::parallel::cp {
namespace {

// The all-to-all of P equal blocks along dim 0 of x (P, …): block j goes to rank j, block i of
// the result came from rank i. Its backward is the same exchange of the gradient.
Tensor exchange(const Tensor& x, Communicator& group) {
  const Tensor in = ops::contiguous(x.detach());
  Tensor out = Tensor::empty(in.shape(), in.dtype(), in.device());
  group.all_to_all(in, out);
  if (autograd::needs_grad({&x})) {
    autograd::record_function("ulysses_all_to_all", {x}, {&out},
                              [g = &group](const std::vector<Tensor>& grads) {
                                const Tensor gin = ops::contiguous(grads[0]);
                                Tensor gout = Tensor::empty(gin.shape(), gin.dtype(), gin.device());
                                g->all_to_all(gin, gout);
                                return std::vector<Tensor>{gout};
                              });
  }
  return out;
}

// (B, H, L, D) of this rank's tokens, every head → (B, H/P, T, D): this rank's heads of every
// token, in global order.
Tensor heads_to_sequence(const Tensor& x, Communicator& group) {
  const int64_t P = group.size(), B = x.size(0), H = x.size(1), L = x.size(2), D = x.size(3);
  const int64_t c = L / 2;
  Tensor blocks = ops::permute(ops::reshape(x, {B, P, H / P, L, D}), {1, 0, 2, 3, 4});
  Tensor got = exchange(blocks, group);  // (P, B, H/P, L, D): block i is rank i's tokens
  Tensor by_rank = ops::reshape(ops::permute(got, {1, 2, 0, 3, 4}), {B, H / P, P * L, D});
  std::vector<Tensor> chunks;
  for (int64_t k = 0; k < 2 * P; ++k) {  // global chunk k: rank k's first half, or the mirror's
    const int64_t rank = k < P ? k : 2 * P - 1 - k, half = k < P ? 0 : 1;
    chunks.push_back(ops::narrow(by_rank, 2, rank * L + half * c, c));
  }
  return ops::cat(chunks, 2);
}

// The inverse: (B, H/P, T, D) in global order → (B, H, L, D) of this rank's tokens.
Tensor sequence_to_heads(const Tensor& y, Communicator& group) {
  const int64_t P = group.size(), B = y.size(0), Hp = y.size(1), T = y.size(2), D = y.size(3);
  const int64_t c = T / (2 * P), L = 2 * c;
  std::vector<Tensor> parts;
  for (int64_t r = 0; r < P; ++r) {  // rank r's tokens: chunks r and 2P−1−r
    parts.push_back(ops::narrow(y, 2, r * c, c));
    parts.push_back(ops::narrow(y, 2, (2 * P - 1 - r) * c, c));
  }
  Tensor by_rank = ops::reshape(ops::cat(parts, 2), {B, Hp, P, L, D});
  Tensor got = exchange(ops::permute(by_rank, {2, 0, 1, 3, 4}), group);  // block j: rank j's heads
  return ops::reshape(ops::permute(got, {1, 0, 2, 3, 4}), {B, P * Hp, L, D});
}

}  // namespace

bool ulysses_divides(int64_t hq, int64_t hkv, int64_t p) {
  return p >= 1 && hq % p == 0 && hkv >= 1 && (hkv % p == 0 || p % hkv == 0);
}

Tensor ulysses_around(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& group,
                      const GatheredAttention& attend) {
  const int64_t P = group.size();
  if (P == 1) return attend(q, k, v);
  LOOM_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.shape() == v.shape() &&
                 q.size(0) == k.size(0) && q.size(2) == k.size(2) && q.size(3) == k.size(3),
             "ulysses_attention: q (B, Hq, L, D), k and v (B, Hkv, L, D) expected, got ",
             shape_str(q.shape()), ", ", shape_str(k.shape()), ", ", shape_str(v.shape()));
  const int64_t hq = q.size(1), hkv = k.size(1), L = q.size(2);
  LOOM_CHECK(ulysses_divides(hq, hkv, P), "ulysses_attention: ", hq, " query and ", hkv,
             " kv heads do not split over ", P, " ranks (Hq % P == 0, and Hkv % P == 0 or P % Hkv ",
             "== 0)");
  LOOM_CHECK(L % 2 == 0, "ulysses_attention: ", L, " local tokens are not two equal chunks");
  Tensor kk = k, vv = v;
  if (hkv % P != 0) {  // repeat each kv head P/Hkv times (Note [Ulysses])
    const int64_t rep = P / hkv, B = k.size(0), D = k.size(3);
    const auto repeat = [&](const Tensor& x) {
      return ops::reshape(ops::expand(ops::unsqueeze(x, 2), {B, hkv, rep, L, D}), {B, P, L, D});
    };
    kk = repeat(k);
    vv = repeat(v);
  }
  // One after the other: every member issues the group's all-to-alls in the same order.
  const Tensor qs = heads_to_sequence(q, group), ks = heads_to_sequence(kk, group),
               vs = heads_to_sequence(vv, group);
  return sequence_to_heads(attend(qs, ks, vs), group);
}

Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                         Communicator& group, const Tensor& first_keys) {
  return ulysses_around(q, k, v, group, [&](const Tensor& qs, const Tensor& ks, const Tensor& vs) {
    LOOM_CHECK(!first_keys.defined() || (first_keys.dim() == 1 && first_keys.size(0) == qs.size(2)),
               "ulysses_attention: first keys for ", qs.size(2), " tokens expected, got ",
               shape_str(first_keys.shape()));
    return ops::causal_attention(qs, ks, vs, scale, first_keys);
  });
}

}  // namespace loom::parallel::cp
