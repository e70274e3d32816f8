// train/planner/replay.cpp — ByteTimeline and the replay of a transformer's forward and
// backward (see train/planner/replay.h). Each step below names the op whose allocations it
// mirrors; "saved" tensors stay until that op's backward node has run (core/autograd.cpp
// releases a node after it runs), the rest are freed where the C++ temporaries die.
#include "train/planner/replay.h"

#include "core/error.h"
#include "train/planner/replay_steps.h"
#include "train/planner/ring_replay.h"
#include "train/planner/tp_replay.h"

namespace loom::planner {

ByteTimeline::Id ByteTimeline::alloc(int64_t bytes) {
  const Id id = next_++;
  live_[id] = id;
  storage_[id] = {bytes, 1};
  current_ += bytes;
  if (current_ > peak_) {
    peak_ = current_;
    peak_at_ = context_ + phase_;
  }
  return id;
}

void ByteTimeline::replace(Id& id, int64_t bytes) {
  const Id next = alloc(bytes);
  free(id);
  id = next;
}

ByteTimeline::Id ByteTimeline::share(Id id) {
  auto it = live_.find(id);
  LOOM_CHECK(it != live_.end(), "memory replay: handle ", id, " shared after its free");
  const Id next = next_++;
  live_[next] = it->second;
  ++storage_.at(it->second).handles;
  return next;
}

void ByteTimeline::free(Id id) {
  auto it = live_.find(id);
  LOOM_CHECK(it != live_.end(), "memory replay: handle ", id, " freed twice or never allocated");
  auto st = storage_.find(it->second);
  live_.erase(it);
  if (--st->second.handles > 0) return;
  current_ -= st->second.bytes;
  storage_.erase(st);
}

namespace {

using Id = ByteTimeline::Id;
using namespace steps;  // NOLINT(build/namespaces): the replay's shared steps

// One block's forward (layers/block.cpp forward_region); x stays the caller's. Returns the
// saved handles and sets *out to the block's output. In a selective region the GEMMs' and
// attention's results go through `tape` (kept_or_computed in replay_steps.h; null: none).
BlockTape block_forward(ByteTimeline& tl, const ReplayShape& s, Id x, Id* out,
                        KeptResults* tape = nullptr) {
  const int64_t N = s.B * s.T, C = s.C, e = s.e, Nr = tp::stream_rows(s);
  BlockTape b;
  b.x = x;
  const int64_t norm_params = s.llama ? C : 2 * C;  // weight (, bias): layer_norm keeps both
  // norm1 (core/ops/norm.cpp): y, then mean and rstd (LayerNorm) or rstd (RMSNorm).
  b.cn1 = tp::replicated_use(tl, s, norm_params);
  b.y1 = tl.alloc(Nr * C * e);
  b.st1 = tl.alloc(Nr * s.s);
  if (!s.llama) b.st1b = tl.alloc(Nr * s.s);
  // qkv (ops::linear with bias, or ops::matmul): its output; the input is a view of y1. Its
  // weight's cast stays with the node, the bias's dies with the call.
  b.cqkv = param_cast(tl, s, (s.q + 2 * s.kv) * C);
  const Id bqkv = s.llama ? 0 : param_cast(tl, s, s.q + 2 * s.kv);
  const Id qkv = s.sp
                     ? tp::column_forward_sp(tl, s, C, s.q + 2 * s.kv, !s.llama, tape)
                     : kept_or_computed(tl, tape, KeptOp::kMatmul, [&] {
                         Id y = tl.alloc(N * (s.q + 2 * s.kv) * e);
                         if (s.mesh && !s.llama) {  // the column layer adds its bias after the GEMM
                           tl.replace(y, N * (s.q + 2 * s.kv) * e);
                         }
                         return y;
                       });
  drop(tl, bqkv);
  Id rq = 0, rk = 0;
  if (s.llama) {  // ops::rope copies its (strided) input, writes y, frees the copy
    auto rope = [&](int64_t features) {
      const Id copy = tl.alloc(N * features * e), y = tl.alloc(N * features * e);
      tl.free(copy);
      return y;
    };
    rq = rope(s.q);
    rk = rope(s.kv);
  }
  // causal_attention: contiguous q, k, v (the (B, H, T, D) views are strided), out, lse.
  Id result = 0;  // ring attention's output, alive until the projection has run
  if (s.cp > 1) {
    result = ring_attention_forward(tl, s, b, tape);
  } else {
    b.qc = tl.alloc(N * s.q * e);
    b.kc = tl.alloc(N * s.kv * e);
    b.vc = tl.alloc(N * s.kv * e);
    const std::vector<Id> r = kept_or_computed(tl, tape, KeptOp::kAttention, 2, [&] {
      return std::vector<Id>{tl.alloc(N * s.q * e), tl.alloc(s.B * s.heads * s.T * s.s)};
    });
    b.att = r[0];
    b.lse = r[1];
  }
  b.ytr = tl.alloc(N * s.q * e);  // reshape of the transposed output: a copy
  b.cproj = param_cast(tl, s, C * s.q);
  const Id bproj = s.llama || s.sp ? 0 : param_cast(tl, s, C);
  // A plain GEMM's output: a kept result.
  auto gemm = [&](int64_t bytes) {
    return kept_or_computed(tl, tape, KeptOp::kMatmul, [&] { return tl.alloc(bytes); });
  };
  Id a = s.sp     ? tp::row_forward_sp(tl, s, s.q, tape)
         : s.mesh ? tp::row_forward(tl, s, s.q, tape)
                  : gemm(N * C * e);  // proj
  drop(tl, bproj);
  if (s.dropout) {  // the dropped copy replaces the branch
    tl.replace(a, Nr * C * e);
  }
  if (s.branch_scale != 1.0) tl.replace(a, Nr * C * e);  // SDP's block level: the scaled copy
  tl.free(qkv);                                          // the attention forward's locals die
  drop(tl, result);
  if (s.llama) {
    tl.free(rq);
    tl.free(rk);
  }
  b.h = tl.alloc(Nr * C * e);  // x + a
  b.cn2 = tp::replicated_use(tl, s, norm_params);
  b.y2 = tl.alloc(Nr * C * e);
  b.st2 = tl.alloc(Nr * s.s);
  if (!s.llama) b.st2b = tl.alloc(Nr * s.s);
  Id m = 0;
  if (s.llama) {  // gate, up, swiglu, down (SwiGluMlp::forward)
    b.cm1 = param_cast(tl, s, s.F * C);
    b.gate = s.sp ? tp::column_forward_sp(tl, s, C, s.F, false, tape) : gemm(N * s.F * e);
    b.cm2 = param_cast(tl, s, s.F * C);
    b.up = s.sp ? tp::column_forward_sp(tl, s, C, s.F, false, tape) : gemm(N * s.F * e);
    b.act = tl.alloc(N * s.F * e);
    b.cm3 = param_cast(tl, s, C * s.F);
    m = s.sp     ? tp::row_forward_sp(tl, s, s.F, tape)
        : s.mesh ? tp::row_forward(tl, s, s.F, tape)
                 : gemm(N * C * e);
    if (s.scaled_mlp_out) tl.replace(m, N * C * e);  // SDP: down's rescaled partial sum
  } else if (s.scaled_mlp_out) {  // SDP's packed MLP (parallel/sdp/forward_masking.cpp)
    b.cm1 = param_cast(tl, s, s.F * C);
    const Id b1 = param_cast(tl, s, s.F);
    b.pre = gemm(N * s.F * e);  // fc: ops::linear with its bias
    drop(tl, b1);
    b.act = tl.alloc(N * s.F * e);  // gelu(pre): proj keeps it
    const Id b2 = param_cast(tl, s, C);
    b.cm2 = param_cast(tl, s, C * s.F);
    m = gemm(N * C * e);  // proj without its bias, then scaled, then the bias added
    tl.replace(m, N * C * e);
    tl.replace(m, N * C * e);
    drop(tl, b2);
  } else if (s.mesh) {  // Mlp unfused: column fc (+ bias), gelu, row proj (+ bias)
    b.cm1 = param_cast(tl, s, s.F * C);
    const Id b1 = param_cast(tl, s, s.F);
    b.pre = s.sp ? tp::column_forward_sp(tl, s, C, s.F, true, tape)
                 : kept_or_computed(tl, tape, KeptOp::kMatmul, [&] {
                     const Id out = tl.alloc(N * s.F * e), with_bias = tl.alloc(N * s.F * e);
                     tl.free(out);
                     return with_bias;
                   });
    drop(tl, b1);
    b.act = tl.alloc(N * s.F * e);  // gelu(pre): the row layer keeps it
    b.cm2 = param_cast(tl, s, C * s.F);
    const Id b2 = s.sp ? 0 : param_cast(tl, s, C);
    m = s.sp ? tp::row_forward_sp(tl, s, s.F, tape) : tp::row_forward(tl, s, s.F, tape);
    drop(tl, b2);
  } else {  // ops::gelu_mlp: pre and y kept, gelu(pre) for the second GEMM freed
    b.cm1 = param_cast(tl, s, s.F * C);
    const Id b1 = param_cast(tl, s, s.F);
    b.cm2 = param_cast(tl, s, C * s.F);
    const Id b2 = param_cast(tl, s, C);
    const std::vector<Id> r = kept_or_computed(tl, tape, KeptOp::kMatmul, 2, [&] {
      const Id pre = tl.alloc(N * s.F * e), y = tl.alloc(N * C * e);
      tl.free(tl.alloc(N * s.F * e));  // gelu(pre), the second GEMM's input
      return std::vector<Id>{pre, y};
    });
    b.pre = r[0];
    m = r[1];
    drop(tl, b1);
    drop(tl, b2);
  }
  if (s.dropout) {
    tl.replace(m, Nr * C * e);
  }
  if (s.branch_scale != 1.0) tl.replace(m, Nr * C * e);
  *out = tl.alloc(Nr * C * e);  // h + m
  tl.free(a);                   // forward_region's locals
  tl.free(m);
  return b;
}

// A norm's backward (core/ops/norm.cpp): dx, dw (, db); the node's release frees its
// statistics and saved input, the incoming gradient dy dies with the engine's buffer. dx then
// meets `other`, the residual's pass-through gradient of the same tensor: the autograd engine
// sums them, and both addends die.
struct NormSaved {
  Id stat = 0, stat_b = 0, input = 0, cast = 0;
};
Id norm_backward_at_fork(ByteTimeline& tl, const ReplayShape& s, ReplayGrads& grads,
                         const NormSaved& saved, Id dy, Id other) {
  const int64_t rows_by_c = tp::stream_rows(s) * s.C * s.e;
  const Id dx = tl.alloc(rows_by_c);
  tp::replicated_grad(tl, s, grads, s.C);
  if (!s.llama) tp::replicated_grad(tl, s, grads, s.C);
  tl.free(saved.stat);
  if (saved.stat_b) tl.free(saved.stat_b);
  tl.free(saved.input);
  drop(tl, saved.cast);
  tl.free(dy);
  const Id sum = tl.alloc(rows_by_c);
  tl.free(other);
  tl.free(dx);
  return sum;
}

// The gradient a residual branch's last ops write before its first node runs: SDP's scale
// (the branch's last op), then dropout's, which frees the scale's once it has run; 0 for none.
Id branch_grad(ByteTimeline& tl, const ReplayShape& s, int64_t bytes) {
  Id g = s.branch_scale != 1.0 ? tl.alloc(bytes) : 0;
  if (s.dropout) {
    const Id d = tl.alloc(bytes);
    drop(tl, g);
    g = d;
  }
  return g;
}

// q's or k's gradient (B, H, T, D) back to rows of `features`: gpt2's reshape copies; llama's
// rope writes dx and copies its strided incoming gradient for the kernel, which then dies.
Id back_to_rows(ByteTimeline& tl, const ReplayShape& s, Id d, int64_t features) {
  const int64_t bytes = s.B * s.T * features * s.e;
  const Id rows = tl.alloc(bytes);
  if (s.llama) tl.free(tl.alloc(bytes));
  tl.free(d);
  return rows;
}

// The backward of one block; g (the gradient at its output) is consumed. Returns the gradient
// at its input.
Id block_backward(ByteTimeline& tl, const ReplayShape& s, BlockTape& b, Id g, ReplayGrads& grads) {
  const int64_t N = s.B * s.T, C = s.C, e = s.e, q3 = s.q + 2 * s.kv, Nr = tp::stream_rows(s);
  const bool bias = !s.llama;
  Id dn2 = 0;  // the gradient at norm2's output
  // Dropout's backward writes the branch's gradient anew (and SDP's scale before it, each node
  // freeing what it consumed); the MLP's first node consumes it.
  const Id dm = branch_grad(tl, s, Nr * C * e);
  // A column layer's dX (all-reduced in place, or under SP reduce-scattered) and dW (, db).
  auto column_backward = [&](int64_t out, bool with_bias) {
    if (s.sp) return tp::column_backward_sp(tl, s, grads, C, out, with_bias);
    const Id dx = tl.alloc(Nr * C * e);
    weight_grad(tl, s, grads, out * C);
    if (with_bias) weight_grad(tl, s, grads, out);
    return dx;
  };
  // A row layer's (or a plain linear's) dX over all rows and dW.
  auto row_backward = [&](int64_t in) {
    if (s.sp) return tp::row_backward_sp(tl, s, grads, in);
    const Id dx = tl.alloc(N * in * e);
    weight_grad(tl, s, grads, C * in);
    return dx;
  };
  if (s.llama) {
    // SDP: the scale's gradient first. down: da (N, F), dW; frees act.
    const Id ds = s.scaled_mlp_out ? tl.alloc(N * C * e) : 0;
    const Id da = row_backward(s.F);
    tl.free(b.act);
    drop(tl, b.cm3);
    drop(tl, ds);
    drop(tl, dm);
    // swiglu: dgate, dup; frees gate and up; da dies.
    const Id dgate = tl.alloc(N * s.F * e), dup = tl.alloc(N * s.F * e);
    tl.free(b.gate);
    tl.free(b.up);
    tl.free(da);
    // up (the newer node) then gate: dx each, summed where they meet (norm2's output).
    const Id dxu = column_backward(s.F, false);
    tl.free(dup);
    drop(tl, b.cm2);
    const Id dxg = column_backward(s.F, false);
    tl.free(b.y2);
    drop(tl, b.cm1);
    dn2 = tl.alloc(Nr * C * e);
    tl.free(dxu);
    tl.free(dxg);
    tl.free(dgate);
  } else if (s.scaled_mlp_out || s.mesh) {
    // Unfused: proj's bias added apart (db; under TP through copy_to_region), SDP's scale (a
    // fresh gradient), the row node (dx, dW; frees gelu's output), gelu's backward (frees pre),
    // the column node (dx, all-reduced in place under TP; dW, db).
    Id ds = 0;
    if (s.scaled_mlp_out) {
      weight_grad(tl, s, grads, C);
      ds = tl.alloc(N * C * e);
      drop(tl, dm);
    } else {
      tp::replicated_grad(tl, s, grads, C);
    }
    const Id dact = row_backward(s.F);
    tl.free(b.act);
    drop(tl, b.cm2);
    if (s.scaled_mlp_out) {
      tl.free(ds);
    } else {
      drop(tl, dm);
    }
    const Id dpre = tl.alloc(N * s.F * e);
    tl.free(b.pre);
    tl.free(dact);
    dn2 = column_backward(s.F, true);
    tl.free(b.y2);
    drop(tl, b.cm1);
    tl.free(dpre);
  } else {
    // gelu_mlp: dpre, db_fc, dx, dW_fc, gelu(pre) again, dW_proj, db_proj; gemm_dgelu_bgrad's
    // scratch as ReplayShape::cuda says.
    const Id dpre = tl.alloc(N * s.F * e);  // dies with its scope, before gelu(pre) again
    const Id db1 = tl.alloc(s.F * e);
    const bool half = e < 4;
    const int64_t scratch = !s.cuda ? N * s.F * e : !half || s.F % 8 == 0 ? 0 : N * s.F * 4;
    if (scratch) tl.free(tl.alloc(scratch));
    tl.free(db1);
    // The node's four parameter gradients are its outputs: alive until it returns, then each
    // lands (kept as .grad, or added into one and freed) after the node's release.
    const Id gb1 = tl.alloc(s.F * e);
    dn2 = tl.alloc(N * C * e);
    const Id gw1 = tl.alloc(s.F * C * e);
    tl.free(dpre);
    const Id hid = tl.alloc(N * s.F * e);
    const Id gw2 = tl.alloc(C * s.F * e);
    tl.free(hid);
    const Id gb2 = tl.alloc(C * e);
    tl.free(b.pre);
    tl.free(b.y2);
    drop(tl, b.cm1);
    drop(tl, b.cm2);
    drop(tl, dm);
    land_weight_grad(tl, s, grads, gb1, s.F);
    land_weight_grad(tl, s, grads, gw1, s.F * C);
    land_weight_grad(tl, s, grads, gw2, C * s.F);
    land_weight_grad(tl, s, grads, gb2, C);
  }
  // norm2's backward, then h's two consumers (the residual and norm2) meet.
  const Id gh = norm_backward_at_fork(tl, s, grads, {b.st2, b.st2b, b.h, b.cn2}, dn2, g);
  // proj (after the attention branch's dropout): dx (N, q), dW (, db); frees its input.
  const Id da = branch_grad(tl, s, Nr * C * e);
  if (bias && s.mesh) tp::replicated_grad(tl, s, grads, C);  // the row layer's bias, added apart
  const Id dproj = row_backward(s.q);
  if (bias && !s.mesh) weight_grad(tl, s, grads, C);
  tl.free(b.ytr);
  drop(tl, b.cproj);
  drop(tl, da);
  // attention: dq, dk, dv, then the strided incoming gradient made contiguous.
  Id dq = 0, dk = 0, dv = 0;
  if (s.cp > 1) {
    const RingGrads r = ring_attention_backward(tl, s, b);
    dq = r.dq;
    dk = r.dk;
    dv = r.dv;
  } else {
    dq = tl.alloc(N * s.q * e);
    dk = tl.alloc(N * s.kv * e);
    dv = tl.alloc(N * s.kv * e);
    const Id gc = tl.alloc(N * s.q * e);
    tl.free(gc);
    tl.free(b.qc);
    tl.free(b.kc);
    tl.free(b.vc);
    tl.free(b.att);
    tl.free(b.lse);
  }
  tl.free(dproj);
  // Back to (B, T, features): v's reshape copies; q and k likewise, or through rope's backward.
  const Id dv2 = tl.alloc(N * s.kv * e);
  tl.free(dv);
  const Id dk2 = back_to_rows(tl, s, dk, s.kv);
  const Id dq2 = back_to_rows(tl, s, dq, s.q);
  // split's backward: one (N, q + 2kv) cat.
  const Id dqkv = tl.alloc(N * q3 * e);
  tl.free(dq2);
  tl.free(dk2);
  tl.free(dv2);
  // qkv: dx, dW (, db); frees y1.
  const Id dn1 = column_backward(q3, bias);
  tl.free(b.y1);
  drop(tl, b.cqkv);
  tl.free(dqkv);
  // norm1's backward, then x's two consumers (the residual and norm1) meet.
  const Id gx = norm_backward_at_fork(tl, s, grads, {b.st1, b.st1b, b.x, b.cn1}, dn1, gh);
  return gx;
}

// A checkpointed block (core/checkpoint.cpp): the region runs with its graph, which is dropped
// at once; the input and the output stay, and under selective recompute the tape's kept
// results (Note [Selective recompute] in core/checkpoint.h). Backward recomputes the region,
// then runs it back.
BlockTape checkpointed_forward(ByteTimeline& tl, const ReplayShape& s, Id x, Id* out) {
  Id region_out = 0;
  KeptResults tape;
  tape.keep = s.keep;
  BlockTape region = block_forward(tl, s, x, &region_out, s.keep ? &tape : nullptr);
  BlockTape kept;
  kept.x = x;
  kept.kept = tape.ids;
  for (Id id : {region.y1,   region.st1,   region.st1b, region.qc,  region.kc,  region.vc,
                region.att,  region.lse,   region.ytr,  region.h,   region.y2,  region.st2,
                region.st2b, region.pre,   region.gate, region.up,  region.act, region.cn1,
                region.cqkv, region.cproj, region.cn2,  region.cm1, region.cm2, region.cm3}) {
    if (id) tl.free(id);
  }
  *out = region_out;
  return kept;
}

// The region's backward captures its parameters' gradients and hands them to the accumulators
// only when the checkpoint node returns; the incoming gradient stays in the engine's buffer
// until then (core/checkpoint.cpp CheckpointNode::apply).
Id checkpointed_backward(ByteTimeline& tl, const ReplayShape& s, BlockTape& kept, Id g,
                         ReplayGrads& grads) {
  Id again = 0;
  const Id x_alias = tl.alloc(0);  // the node keeps its input until it returns
  KeptResults tape;  // selective: the recomputation takes the kept results, then drops the tape
  tape.keep = s.keep;
  tape.replaying = true;
  tape.ids = kept.kept;
  BlockTape region = block_forward(tl, s, x_alias, &again, s.keep ? &tape : nullptr);
  LOOM_CHECK(tape.next == tape.ids.size(), "memory replay: the recomputation took ", tape.next,
             " of ", tape.ids.size(), " kept results");
  for (Id id : tape.ids) tl.free(id);
  ReplayShape captured = s;
  captured.keep_weight_grads = true;
  ReplayGrads held;
  const Id g_alias = tl.alloc(0);  // the region frees this alias; g itself stays
  const Id gx = block_backward(tl, captured, region, g_alias, held);
  tl.free(again);
  tl.free(g);
  tl.free(kept.x);
  for (Id id : held.kept) {
    if (s.keep_weight_grads) {
      grads.kept.push_back(id);
    } else {
      tl.free(id);
    }
  }
  return gx;
}

// The shape of block `block` (its MLP hidden under SDP's neuron level).
ReplayShape with_block_ffn(const ReplayShape& s, int64_t block) {
  ReplayShape b = s;
  if (!s.block_ffn.empty()) b.F = s.block_ffn[static_cast<size_t>(block)];
  return b;
}

}  // namespace

StageActivations replay_forward(ByteTimeline& tl, const ReplayShape& s, int64_t blocks, bool embed,
                                bool head, Id input) {
  const int64_t N = s.B * s.T, C = s.C, e = s.e;
  StageActivations a;
  Id x = input;
  UnitEvents* u = s.units;
  const int head_unit = static_cast<int>(s.layers > 0 ? s.layers : blocks) + 1;
  if (embed) {
    tl.set_phase("forward: embeddings");
    if (u) u->before_forward(0);
    // A lookup reads the master table; under mixed precision its rows are then cast.
    auto lookup = [&](int64_t rows) {
      if (!mixed(s)) return tl.alloc(rows * C * e);
      const Id master = tl.alloc(rows * C * s.w), cast = tl.alloc(rows * C * e);
      tl.free(master);
      return cast;
    };
    // Tensor parallel: VocabParallelEmbedding (parallel/tp/layers.cpp) — this rank's ids (i64)
    // and row mask (master dtype) kept for backward, the masked lookup, its cast, and the
    // all-reduced sum (a fresh tensor).
    auto tp_lookup = [&]() {
      const int64_t me = mixed(s) ? s.w : e;
      a.tp_ids = tl.alloc(N * 8);
      a.tp_mask = tl.alloc(N * me);
      const Id rows = tl.alloc(N * C * me);
      Id partial = tl.alloc(N * C * me);
      tl.free(rows);
      if (mixed(s)) {
        tl.replace(partial, N * C * e);
      }
      Id sum = 0;
      if (s.sp) {  // reduce_scatter_to_sequence: a send copy, this rank's rows
        const Id send = tl.alloc(N * C * e);
        sum = tl.alloc(tp::stream_rows(s) * C * e);
        tl.free(send);
      } else {
        sum = tl.alloc(N * C * e);
      }
      tl.free(partial);
      return sum;
    };
    if (s.llama) {
      x = s.mesh ? tp_lookup() : lookup(N);
    } else {  // wte rows + wpe rows (T, C) broadcast; the positions stay for wpe's backward
      const int64_t R = s.sp ? s.T / s.tp : s.T;     // this rank's rows of the sequence
      a.positions = s.packed ? 0 : tl.alloc(R * 4);  // packed: the batch's own positions
      const Id tok = s.mesh ? tp_lookup() : lookup(N);
      // Under SP wpe is used through copy_to_region: a copy of the master table for the lookup.
      const Id table = s.sp ? tl.alloc(s.max_positions * C * (mixed(s) ? s.w : e)) : 0;
      const Id pos = lookup(R);
      drop(tl, table);
      x = tl.alloc(tp::stream_rows(s) * C * e);
      tl.free(tok);
      tl.free(pos);
    }
    if (u) u->after_forward(0);
  }
  for (int64_t i = 0; i < blocks; ++i) {
    tl.set_phase("forward: block " + std::to_string(i));
    if (u) u->before_forward(static_cast<int>(s.first_block + i) + 1);
    Id out = 0;
    const ReplayShape bs = with_block_ffn(s, s.first_block + i);
    a.blocks.push_back(s.checkpointing ? checkpointed_forward(tl, bs, x, &out)
                                       : block_forward(tl, bs, x, &out));
    x = out;
    if (u) u->after_forward(static_cast<int>(s.first_block + i) + 1);
  }
  if (!head) {
    a.output = x;
    return a;
  }
  tl.set_phase("forward: head and loss");
  if (u) u->before_forward(head_unit);
  if (u && s.head_reads_table) u->before_forward(0);  // the tied head reads wte
  a.embed_x = x;  // the last block's output, saved by the final norm
  a.cnf = tp::replicated_use(tl, s, s.llama ? C : 2 * C);
  const int64_t Nr = tp::stream_rows(s);
  a.hf = tl.alloc(Nr * C * e);
  a.stf = tl.alloc(Nr * s.s);
  if (!s.llama) a.stfb = tl.alloc(Nr * s.s);
  if (s.sp) {  // gather_from_sequence: all rows (a gather buffer, then their concatenation)
    const Id all = tl.alloc(N * C * e), rows = tl.alloc(N * C * e);
    tl.free(all);
    tl.free(a.hf);
    a.hf = rows;
  } else if (s.mesh) {  // copy_to_region: the head's input is a copy (its backward all-reduces)
    tl.replace(a.hf, N * C * e);
  }
  a.chead = param_cast(tl, s, s.V * C);
  a.logits = tl.alloc(N * s.V * e);
  if (u && s.head_reads_table) u->after_forward(0);
  if (u) u->after_forward(head_unit);
  if (s.mesh) {  // vocab_parallel_cross_entropy (parallel/tp/cross_entropy.cpp)
    const Id lse_local = tl.alloc(N * s.s), target_logit = tl.alloc(N * s.s);
    const Id lses = tl.alloc(s.tp * N * s.s), target_sum = tl.alloc(N * s.s);
    a.lse = tl.alloc(N * s.s);
    const Id row_loss = tl.alloc(N * 8);
    for (Id id : {lse_local, target_logit, lses, target_sum, row_loss}) tl.free(id);
    return a;
  }
  const Id rows = tl.alloc(N * s.s);
  a.lse = tl.alloc(N * s.s);
  tl.free(rows);
  return a;
}

ByteTimeline::Id replay_backward(ByteTimeline& tl, const ReplayShape& s, StageActivations& a,
                                 ByteTimeline::Id grad_in, ReplayGrads& grads, bool embed,
                                 bool head) {
  const int64_t N = s.B * s.T, C = s.C, e = s.e;
  UnitEvents* u = s.units;
  const int head_unit =
      static_cast<int>(s.layers > 0 ? s.layers : static_cast<int64_t>(a.blocks.size())) + 1;
  Id g = grad_in;
  if (head) {
    tl.set_phase("backward: loss and head");
    const Id dlogits = tl.alloc(N * s.V * e);  // softmax_cross_entropy's dx
    tl.free(a.logits);
    tl.free(a.lse);
    if (u) u->before_backward(head_unit);  // the identities wrapping the logits
    if (u && s.head_reads_table) u->before_backward(0);
    const Id dh = tl.alloc(N * C * e);      // the head GEMM's dx, then dW (V, C)
    if (s.tied && !s.tied_partial_taken) {  // held for the embedding's contribution
      a.table_grad = tl.alloc(s.V * C * e);
      if (mixed(s)) {  // what the engine holds is the cast back to the master dtype
        tl.replace(a.table_grad, s.V * C * s.w);
      }
    } else {
      ReplayShape taken = s;
      taken.keep_weight_grads = s.keep_weight_grads && !s.tied;
      weight_grad(tl, taken, grads, s.V * C);
      // A pipeline's last stage: the head's is the copy's only gradient, so its unit is ready.
      if (u && s.head_reads_table && !s.tied) u->gradients_ready(0);
    }
    tl.free(a.hf);
    drop(tl, a.chead);
    tl.free(dlogits);
    Id dh_in = dh;
    if (s.sp) {  // gather_from_sequence's backward: reduce-scatter (a send copy, this rank's rows)
      const Id send = tl.alloc(N * C * e);
      dh_in = tl.alloc(tp::stream_rows(s) * C * e);
      tl.free(send);
      tl.free(dh);
    } else if (s.mesh) {  // copy_to_region's backward: the all-reduced copy
      dh_in = tl.alloc(N * C * e);
      tl.free(dh);
    }
    g = tl.alloc(tp::stream_rows(s) * C * e);  // the final norm's dx, dw (, db)
    tp::replicated_grad(tl, s, grads, C);
    if (!s.llama) tp::replicated_grad(tl, s, grads, C);
    tl.free(a.stf);
    if (a.stfb) tl.free(a.stfb);
    tl.free(a.embed_x);
    drop(tl, a.cnf);
    tl.free(dh_in);
    if (u) u->gradients_ready(head_unit);
  }
  for (int64_t i = static_cast<int64_t>(a.blocks.size()); i-- > 0;) {
    tl.set_phase("backward: block " + std::to_string(i));
    if (u) u->before_backward(static_cast<int>(s.first_block + i) + 1);
    BlockTape& b = a.blocks[static_cast<size_t>(i)];
    const ReplayShape bs = with_block_ffn(s, s.first_block + i);
    g = s.checkpointing ? checkpointed_backward(tl, bs, b, g, grads)
                        : block_backward(tl, bs, b, g, grads);
    if (u) u->gradients_ready(static_cast<int>(s.first_block + i) + 1);
  }
  if (!embed) return g;
  tl.set_phase("backward: embeddings");
  if (u) u->before_backward(0);
  // The tables' gradients are computed in the master dtype (the lookups read the masters);
  // under mixed precision the rows' gradient is cast back first.
  ReplayShape table = s;
  table.e = mixed(s) ? s.w : s.e;
  table.w = 0;
  if (!s.llama) {
    const int64_t R = s.sp ? s.T / s.tp : s.T;
    const Id dpos = tl.alloc(R * C * e);  // the broadcast add's sum over rows
    const Id dpos_master = mixed(s) ? tl.alloc(R * C * s.w) : 0;
    if (s.sp) {  // through copy_to_region: the table's gradient all-reduced into a copy
      ReplayShape copied = table;
      copied.sp = true;
      tp::replicated_grad(tl, copied, grads, s.max_positions * C);
    } else {
      weight_grad(tl, table, grads, s.max_positions * C);
    }
    drop(tl, a.positions);
    drop(tl, dpos_master);
    tl.free(dpos);
  }
  Id g_full = 0;  // SP: reduce_scatter_to_sequence's backward gathers all rows
  if (s.sp) {
    const Id all = tl.alloc(N * C * e);
    g_full = tl.alloc(N * C * e);
    tl.free(all);
  }
  const Id g_master = mixed(s) ? tl.alloc(N * C * s.w) : 0;
  Id dmasked = 0;  // TP: the row mask's product's backward, then the lookup's
  if (a.tp_mask) {
    dmasked = tl.alloc(N * C * (mixed(s) ? s.w : e));
    tl.free(a.tp_mask);
  }
  if (a.table_grad) {  // the engine sums the two contributions; the sum lands as the gradient
    const Id emb = tl.alloc(s.V * C * table.e), sum = tl.alloc(s.V * C * table.e);
    tl.free(a.table_grad);
    tl.free(emb);
    if (s.keep_weight_grads) {
      grads.kept.push_back(sum);
    } else {
      tl.free(sum);
    }
  } else {
    weight_grad(tl, table, grads, s.V * C);
  }
  drop(tl, a.tp_ids);
  drop(tl, dmasked);
  drop(tl, g_master);
  drop(tl, g_full);
  tl.free(g);
  if (u) u->gradients_ready(0);
  return 0;
}

}  // namespace loom::planner
