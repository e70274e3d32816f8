// parallel/tp/layers.cpp — the tensor-parallel layers (see the header). Each forward is one
// local GEMM (or lookup) between the matched communication ops of parallel/tp/comm_ops.h.
#include "parallel/tp/layers.h"

#include <functional>
#include <string>
#include <utility>

#include "core/autograd.h"
#include "core/checkpoint.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/matmul.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "core/rng.h"
#include "kernels/embedding.h"
#include "parallel/comm/ring.h"
#include "parallel/mesh.h"
#include "parallel/tp/comm_ops.h"

namespace loom::parallel::tp {
namespace {

int64_t shard_size(int64_t n, const Communicator& tp, const char* what) {
  LOOM_CHECK(n % tp.size() == 0, what, ": ", n, " does not divide by the tensor-parallel size ",
             tp.size());
  return n / tp.size();
}

// dst ← src (the same shape), outside autograd.
void assign(Tensor dst, const Tensor& src, const char* what) {
  LOOM_CHECK(dst.shape() == src.shape(), what, ": part ", shape_str(src.shape()),
             " does not match the parameter ", shape_str(dst.shape()));
  autograd::NoGradGuard no_grad;
  ops::copy_(dst, src.to(dst.device()));
}

void copy_slice(Tensor& dst, const Tensor& full, int64_t dim, int64_t start, const char* what) {
  LOOM_CHECK(full.dim() == dst.dim() && start + dst.size(dim) <= full.size(dim), what,
             ": full tensor ", shape_str(full.shape()), " does not match shard ",
             shape_str(dst.shape()));
  autograd::NoGradGuard no_grad;
  assign(dst, ops::narrow(full, dim, start, dst.size(dim)), what);
}

int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Note [Placement] (core/placement.h) of this rank's part of a tensor split along `dim` over the
// TP group: per segment s (sizes summing to the global dim) the rank holds the run
// [rank·s/tp, (rank+1)·s/tp) of that segment, the runs concatenated in segment order.
void place_split(Tensor& t, int64_t dim, const std::vector<int64_t>& segments,
                 const Communicator& tp) {
  Placement p;
  p.global_shape = t.shape();
  PlacementSplit split{dim, kAxisTp, {}};
  int64_t local = 0, global = 0;
  for (int64_t s : segments) {
    const int64_t n = s / tp.size();
    split.runs.push_back({local, global + tp.rank() * n, n});
    local += n;
    global += s;
  }
  p.global_shape[static_cast<size_t>(dim)] = global;
  p.splits.push_back(std::move(split));
  t.set_placement(std::move(p));
}

// A parameter every TP rank holds whole (a row-parallel layer's bias).
void place_replicated(Tensor& t) {
  Placement p = t.placement();
  p.add_replicated(kAxisTp);
  t.set_placement(std::move(p));
}

// fn(), reported to the sink as the span `what` when there is one.
template <typename Fn>
Tensor timed(const SpanSinkPtr& spans, const char* what, Fn&& fn) {
  if (!spans || !*spans) return fn();
  const auto t0 = std::chrono::steady_clock::now();
  Tensor out = fn();
  (*spans)(what, t0, std::chrono::steady_clock::now());
  return out;
}

// x (B, T, K) · wᵀ (w: (N, K)) → (B, T, N), as rows.
Tensor gemm_nt(const Tensor& x, const Tensor& w) { return ops::matmul(x, w, false, true); }

// Σ over the rows of dyᵀ·x: dy (B, T, N), x (B, T, K) → (N, K).
Tensor weight_grad(const Tensor& dy, const Tensor& x) {
  const int64_t rows = dy.numel() / dy.size(-1);
  return ops::matmul(ops::reshape(ops::contiguous(dy), {rows, dy.size(-1)}),
                     ops::reshape(ops::contiguous(x), {rows, x.size(-1)}), true, false);
}

// Ring transfers of the TP layers (Note [TP communication overlap]): tags from kRingTag up.
constexpr int kRingTag = 7000;
RingStep ring_exchange(Communicator& tp, const Tensor& out, const Tensor& in, int step) {
  return ring_step(tp, out, in, kRingTag + step);
}

// A ring all-gather that works on each chunk as it passes: every rank starts with its own
// chunk `local` (chunk index = its rank); at each step it posts the transfer of the chunk it
// holds to the next rank, calls use(q, chunk q) while that travels, then takes the chunk
// received from the previous rank. use() sees every chunk of the group once.
void ring_each(Communicator& tp, const Tensor& local,
               const std::function<void(int q, const Tensor& chunk)>& use) {
  const int n = tp.size();
  Tensor held = local;
  int q = tp.rank();
  for (int step = 0; step < n; ++step) {
    Tensor next;
    RingStep ring;
    if (step < n - 1) {
      next = Tensor::empty_like(local);
      ring = ring_exchange(tp, held, next, step);
    }
    use(q, held);
    if (step < n - 1) {
      ring.wait();
      held = next;
      q = (q + n - 1) % n;
    }
  }
}

// Note [TP communication overlap]: which TP collectives overlap which GEMM (n = TP size).
//   column forward, SP (all-gather → GEMM): a ring. Each rank starts with its own sequence
//     chunk; at every step it passes the chunk it holds to the next rank while it multiplies
//     that chunk (n GEMMs of T/n rows, n−1 transfers each hidden behind one of them).
//   column backward: Note [Column-parallel backward overlap].
//   row forward, SP (GEMM → reduce-scatter): a ring reduce-scatter. At step s rank r
//     multiplies its rows of chunk (r−s−1) mod n while the partial sum of the previous step
//     travels; it adds the received partial and passes it on; after n−1 steps it holds its own
//     chunk summed over the group (Megatron's GEMM + reduce-scatter overlap).
//   row backward, SP (all-gather of dY → GEMMs): the same ring as the column forward, each
//     chunk of dY multiplied (dX rows and the dW sum) while the next one travels.
//   row forward without SP (GEMM → all-reduce): the rows in two halves, the first half's
//     all-reduce running while the second half is multiplied.
//   row backward without SP, column forward without SP: no communication.
//   vocab-parallel embedding: a lookup, nothing to hide a reduction behind.
// Row chunks of a GEMM give the same per-row sums as the whole GEMM; only the summation order
// across TP ranks (the ring) and of dW over chunks differ from the collective's, at f32
// rounding. Every ring transfer is one send and one receive posted before the GEMM it hides
// behind; the SpanSink reports each GEMM, the communicator's observer each transfer.

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, std::vector<int64_t> segments,
                                           bool bias, Communicator& tp, bool sequence_parallel,
                                           DType dtype, Device device, SpanSinkPtr spans)
    : tp_(&tp),
      sequence_parallel_(sequence_parallel),
      segments_(std::move(segments)),
      in_features_(in_features),
      spans_(std::move(spans)) {
  int64_t out = 0;
  for (int64_t s : segments_) out += shard_size(s, tp, "ColumnParallelLinear out features");
  weight_ = register_parameter("weight", Tensor::zeros({out, in_features}, dtype, device));
  place_split(weight_, 0, segments_, tp);
  if (bias) {
    bias_ = register_parameter("bias", Tensor::zeros({out}, dtype, device));
    place_split(bias_, 0, segments_, tp);
  }
}

Tensor ColumnParallelLinear::part_of(const Tensor& full) const {
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> parts;
  int64_t begin = 0;
  for (int64_t s : segments_) {
    const int64_t len = s / tp_->size();
    parts.push_back(ops::narrow(full, 0, begin + tp_->rank() * len, len));
    begin += s;
  }
  return ops::contiguous(ops::cat(parts, 0));
}

void ColumnParallelLinear::init(Generator& gen, double std) {
  assign(weight_,
         part_of(randn({sum_of(segments_), in_features_}, gen, weight_.dtype(), 0.0, std,
                       weight_.device())),
         "ColumnParallelLinear.init");
  if (bias_.defined())
    assign(bias_, Tensor::zeros(bias_.shape(), bias_.dtype()), "ColumnParallelLinear.init");
}

void ColumnParallelLinear::zero_rows_from(int64_t global_row) {
  Tensor mask_rows = Tensor::ones({sum_of(segments_), 1}, weight_.dtype());
  if (global_row < sum_of(segments_)) {
    autograd::NoGradGuard no_grad;
    Tensor tail = ops::narrow(mask_rows, 0, global_row, sum_of(segments_) - global_row);
    ops::copy_(tail, Tensor::zeros(tail.shape(), weight_.dtype()));
  }
  autograd::NoGradGuard no_grad;
  const Tensor keep = part_of(mask_rows).to(weight_.device());
  assign(weight_, ops::mul(weight_.detach(), keep), "ColumnParallelLinear.zero_rows_from");
}

// Note [Column-parallel backward overlap]: the layer is one autograd node so that its backward
// can overlap communication with the two GEMMs, as Megatron does:
//   1. (sequence parallel) start the all-gather of the saved local input x again — the full
//      input is not kept between forward and backward, saving T×C per layer;
//   2. dX = dY·W (GEMM) while 1 runs;
//   3. start the reduction of dX over the TP group (reduce-scatter along the sequence under SP,
//      else all-reduce): each rank holds only its output columns' share of it;
//   4. wait for 1; dW = dYᵀ·X (GEMM) and db = Σ dY while 3 runs;
//   5. wait for 3.
// The forward's all-gather is a ring hidden behind the GEMM's sequence chunks (Note [TP
// communication overlap]). The communicator reports each operation's queued/started/finished
// times (CommEvent) and the SpanSink each GEMM, which the profiler trace shows side by side.
Tensor ColumnParallelLinear::forward(const Tensor& x) const {
  LOOM_CHECK(x.dim() == 3 && x.size(2) == in_features_, "ColumnParallelLinear: x must be (B, T, ",
             in_features_, "), got ", shape_str(x.shape()));
  const Tensor xl = ops::contiguous(x.detach());
  // The node's inputs are the compute-dtype casts (Note [Compute dtype] in layers/module.h):
  // its gradients come back in that dtype and the casts' backward turns them into the masters'.
  const Tensor wc = compute(weight_), bc = compute(bias_);
  // Note [Selective recompute] in core/checkpoint.h: kept, the output (all-gather included).
  Tensor y = kept_or_computed(KeptOp::kMatmul, [&] {
    autograd::NoGradGuard no_grad;
    Tensor out;
    const int n = tp_->size();
    auto chunk_gemm = [&](const Tensor& in) {
      return timed(spans_, "tp column: GEMM", [&] {
        const Tensor out = gemm_nt(in, wc.detach());
        return bc.defined() ? ops::add(out, bc.detach()) : out;
      });
    };
    if (!sequence_parallel_ || n == 1) {
      out = chunk_gemm(xl);
    } else {  // ring all-gather, chunk by chunk
      std::vector<Tensor> parts(static_cast<size_t>(n));
      ring_each(*tp_, xl, [&](int q, const Tensor& chunk) {
        parts[static_cast<size_t>(q)] = chunk_gemm(chunk);
      });
      out = ops::cat(parts, 1);
    }
    return std::vector<Tensor>{out};
  })[0];
  std::vector<Tensor> inputs{x, wc};
  if (bc.defined()) inputs.push_back(bc);
  if (!autograd::needs_grad(inputs)) return y;
  Communicator* tp = tp_;
  const bool sp = sequence_parallel_;
  const Tensor w = wc.detach();
  const bool has_bias = bc.defined();
  const SpanSinkPtr spans = spans_;
  autograd::record_function(
      "column_parallel_linear", inputs, {&y}, [=](const std::vector<Tensor>& g) {
        autograd::NoGradGuard no_grad;
        const Tensor dy = ops::contiguous(g[0]);  // (B, T, out/tp)
        const int n = tp->size();
        // 1. the full input again (sequence parallel), in rank order: (n, B, T/n, C)
        Tensor gathered;
        WorkPtr gather;
        if (sp && n > 1) {
          Shape s = xl.shape();
          s.insert(s.begin(), n);
          gathered = Tensor::empty(s, xl.dtype(), xl.device());
          gather = tp->all_gather_async(ops::view(xl, {xl.numel()}),
                                        ops::view(gathered, {gathered.numel()}));
        }
        // 2. dX = dY·W over the full local sequence
        const Tensor dx_full =
            timed(spans, "tp column: dX GEMM", [&] { return ops::matmul(dy, w, false, false); });
        // 3. its reduction over the group
        Tensor dx, send;
        WorkPtr reduce;
        if (n == 1) {
          dx = dx_full;
        } else if (sp) {
          const int64_t len = dx_full.size(1) / n;
          std::vector<Tensor> parts;
          for (int r = 0; r < n; ++r)
            parts.push_back(ops::unsqueeze(ops::narrow(dx_full, 1, r * len, len), 0));
          send = ops::contiguous(ops::cat(parts, 0));
          dx = Tensor::empty(xl.shape(), dx_full.dtype(), dx_full.device());
          reduce = tp->reduce_scatter_async(ops::view(send, {send.numel()}),
                                            ops::view(dx, {dx.numel()}), ReduceOp::kSum);
        } else {
          dx = dx_full;
          reduce = tp->all_reduce_async(ops::view(dx, {dx.numel()}), ReduceOp::kSum);
        }
        // 4. dW = dYᵀ·X and db = Σ dY while the reduction runs
        Tensor x_full = xl;
        if (gather) {
          gather->wait();
          std::vector<Tensor> parts;
          for (int r = 0; r < n; ++r)
            parts.push_back(ops::squeeze(ops::narrow(gathered, 0, r, 1), 0));
          x_full = ops::cat(parts, 1);
        }
        const int64_t rows = dy.numel() / dy.size(-1);
        const Tensor dw =
            timed(spans, "tp column: dW GEMM", [&] { return weight_grad(dy, x_full); });
        std::vector<Tensor> out{Tensor(), dw};
        if (has_bias) out.push_back(ops::sum(ops::reshape(dy, {rows, dy.size(-1)}), 0));
        // 5.
        if (reduce) reduce->wait();
        out[0] = dx;
        return out;
      });
  return y;
}

void ColumnParallelLinear::load_shard(const Tensor& full_weight, const Tensor& full_bias) {
  assign(weight_, part_of(full_weight), "ColumnParallelLinear.load_shard");
  if (bias_.defined()) assign(bias_, part_of(full_bias), "ColumnParallelLinear.load_shard");
}

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, bool bias,
                                     Communicator& tp, bool sequence_parallel, DType dtype,
                                     Device device, SpanSinkPtr spans)
    : tp_(&tp),
      sequence_parallel_(sequence_parallel),
      in_features_(in_features),
      spans_(std::move(spans)) {
  const int64_t in = shard_size(in_features, tp, "RowParallelLinear in_features");
  weight_ = register_parameter("weight", Tensor::zeros({out_features, in}, dtype, device));
  place_split(weight_, 1, {in_features}, tp);
  if (bias) {
    bias_ = register_parameter("bias", Tensor::zeros({out_features}, dtype, device));
    place_replicated(bias_);
  }
}

// One autograd node: the GEMM and its reduction interleaved (Note [TP communication overlap]).
Tensor RowParallelLinear::forward(const Tensor& x) const {
  LOOM_CHECK(x.dim() == 3 && x.size(2) == weight_.size(1), "RowParallelLinear: x must be (B, T, ",
             weight_.size(1), "), got ", shape_str(x.shape()));
  const Tensor wc = compute(weight_);  // Note [Compute dtype]
  const Tensor xl = ops::contiguous(x.detach());
  const int n = tp_->size();
  const bool sp = sequence_parallel_ && n > 1;
  LOOM_CHECK(!sp || xl.size(1) % n == 0, "RowParallelLinear: sequence length ", xl.size(1),
             " does not divide by the tensor-parallel size ", n);
  auto gemm = [&](const Tensor& in) {
    return timed(spans_, "tp row: GEMM", [&] { return gemm_nt(in, wc.detach()); });
  };
  // Note [Selective recompute] in core/checkpoint.h: kept, the output (its reduction included).
  Tensor y = kept_or_computed(KeptOp::kMatmul, [&] {
    autograd::NoGradGuard no_grad;
    Tensor out;
    if (n == 1) {
      out = gemm(xl);
    } else if (sp) {  // ring reduce-scatter: this rank ends with chunk r of the sum
      const int r = tp_->rank();
      const int64_t len = xl.size(1) / n;
      Tensor incoming;
      RingStep ring;
      std::vector<Tensor> sent;  // alive until their sends complete
      std::vector<RingStep> sends;
      for (int step = 0; step < n; ++step) {
        const int c = ((r - step - 1) % n + n) % n;
        Tensor part = gemm(ops::contiguous(ops::narrow(xl, 1, c * len, len)));
        if (step > 0) {
          ring.recv->wait();
          part = ops::add(part, incoming);
        }
        if (step < n - 1) {
          incoming = Tensor::empty_like(part);
          ring = ring_exchange(*tp_, part, incoming, step);
          sends.push_back(ring);
          sent.push_back(part);
        } else {
          out = part;
        }
      }
      for (RingStep& st : sends) st.send->wait();
    } else {  // two halves: the first half's all-reduce runs during the second half's GEMM
      const int64_t T = xl.size(1), half = T / 2;
      std::vector<Tensor> parts;
      std::vector<WorkPtr> works;
      for (const auto& [begin, len] : {std::pair<int64_t, int64_t>{0, half}, {half, T - half}}) {
        if (len == 0) continue;
        parts.push_back(gemm(ops::contiguous(ops::narrow(xl, 1, begin, len))));
        works.push_back(
            tp_->all_reduce_async(ops::view(parts.back(), {parts.back().numel()}), ReduceOp::kSum));
      }
      for (WorkPtr& w : works) w->wait();
      out = parts.size() == 1 ? parts[0] : ops::cat(parts, 1);
    }
    return std::vector<Tensor>{out};
  })[0];
  if (autograd::needs_grad({x, wc})) {
    Communicator* tp = tp_;
    const Tensor w = wc.detach();
    const SpanSinkPtr spans = spans_;
    autograd::record_function(
        "row_parallel_linear", {x, wc}, {&y}, [=](const std::vector<Tensor>& g) {
          autograd::NoGradGuard no_grad;
          const Tensor dy = ops::contiguous(g[0]);
          auto dx_gemm = [&](const Tensor& d) {
            return timed(spans, "tp row: dX GEMM", [&] { return ops::matmul(d, w, false, false); });
          };
          auto dw_gemm = [&](const Tensor& d, const Tensor& in) {
            return timed(spans, "tp row: dW GEMM", [&] { return weight_grad(d, in); });
          };
          if (!sp) return std::vector<Tensor>{dx_gemm(dy), dw_gemm(dy, xl)};  // dY is replicated
          // Ring all-gather of dY (B, T/n, C), each chunk's GEMMs while the next one travels.
          const int nn = tp->size();
          const int64_t len = dy.size(1);
          std::vector<Tensor> dx_parts(static_cast<size_t>(nn));
          Tensor dw;
          ring_each(*tp, dy, [&](int q, const Tensor& chunk) {
            dx_parts[static_cast<size_t>(q)] = dx_gemm(chunk);
            const Tensor d = dw_gemm(chunk, ops::narrow(xl, 1, q * len, len));
            dw = dw.defined() ? ops::add(dw, d) : d;
          });
          return std::vector<Tensor>{ops::cat(dx_parts, 1), dw};
        });
  }
  if (!bias_.defined()) return y;
  // Under SP the bias meets only this rank's chunk: its gradient is summed over the group.
  const Tensor b = compute(bias_);
  return ops::add(y, sequence_parallel_ ? copy_to_region(b, *tp_) : b);
}

void RowParallelLinear::load_shard(const Tensor& full_weight, const Tensor& full_bias) {
  const int64_t cols = weight_.size(1);
  copy_slice(weight_, full_weight, 1, tp_->rank() * cols, "RowParallelLinear.load_shard");
  if (bias_.defined()) copy_slice(bias_, full_bias, 0, 0, "RowParallelLinear.load_shard");
}

void RowParallelLinear::init(Generator& gen, double std) {
  const Tensor full =
      randn({weight_.size(0), in_features_}, gen, weight_.dtype(), 0.0, std, weight_.device());
  copy_slice(weight_, full, 1, tp_->rank() * weight_.size(1), "RowParallelLinear.init");
  if (bias_.defined())
    assign(bias_, Tensor::zeros(bias_.shape(), bias_.dtype()), "RowParallelLinear.init");
}

void RowParallelLinear::zero_rows_from(int64_t global_row) {
  if (global_row >= weight_.size(0)) return;
  autograd::NoGradGuard no_grad;
  Tensor rows = ops::narrow(weight_, 0, global_row, weight_.size(0) - global_row);
  ops::copy_(rows, Tensor::zeros(rows.shape(), weight_.dtype(), weight_.device()));
}

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num_embeddings, int64_t dim,
                                               Communicator& tp, bool sequence_parallel,
                                               DType dtype, Device device)
    : tp_(&tp), sequence_parallel_(sequence_parallel) {
  rows_ = shard_size(num_embeddings, tp, "VocabParallelEmbedding num_embeddings");
  weight_ = register_parameter("weight", Tensor::zeros({rows_, dim}, dtype, device));
  place_split(weight_, 0, {num_embeddings}, tp);
}

// Ids outside this rank's rows look up row 0 and are then zeroed by a mask, so the sum over
// the group holds exactly one real row per token. The local ids and the mask are computed where
// the ids live (vocab_parallel_ids), on the weight's device: no host read of the ids, and the
// lookup skips its device check (local ids are in range by construction). Ids on the host are
// checked against the whole (padded) vocabulary there first, as the single-process lookup's are
// (Note [Host ids] in layers/transformer.cpp); ids already on the device are not checked
// against it (an id past the vocabulary would be masked on every rank).
Tensor VocabParallelEmbedding::forward(const Tensor& ids) const {
  const int64_t start = tp_->rank() * rows_;
  if (ids.device().is_cpu()) {
    const Tensor host = ops::contiguous(ids.detach());
    LOOM_DISPATCH_INDEX(host.dtype(), "embedding", [&] {
      kernels::check_embedding_ids(host.data<index_t>(), host.numel(), rows_ * tp_->size());
    });
  }
  const Tensor dev_ids = ops::contiguous(ids.detach().to(weight_.device()));
  Tensor local_ids = Tensor::empty(ids.shape(), DType::kI64, weight_.device());
  Shape mask_shape = ids.shape();
  mask_shape.push_back(1);
  Tensor mask = Tensor::empty(mask_shape, weight_.dtype(), weight_.device());
  kernels::call_kernel<kernels::vocab_parallel_ids_k>(dev_ids, start, rows_, local_ids, mask);
  // In the compute dtype (Note [Compute dtype]); each token's sum over the group has one
  // non-zero term, so reducing in a narrow dtype loses nothing.
  const Tensor partial =
      compute(ops::mul(ops::embedding(local_ids, weight_, /*ids_checked=*/true), mask));
  return sequence_parallel_ ? reduce_scatter_to_sequence(partial, *tp_, 1)
                            : reduce_from_region(partial, *tp_);
}

void VocabParallelEmbedding::init(Generator& gen, double std, int64_t zero_from) {
  Tensor full = randn({rows_ * tp_->size(), weight_.size(1)}, gen, weight_.dtype(), 0.0, std,
                      weight_.device());
  if (zero_from < full.size(0)) {
    autograd::NoGradGuard no_grad;
    Tensor tail = ops::narrow(full, 0, zero_from, full.size(0) - zero_from);
    ops::copy_(tail, Tensor::zeros(tail.shape(), full.dtype()));
  }
  load_shard(full);
}

void VocabParallelEmbedding::load_shard(const Tensor& full_weight) {
  copy_slice(weight_, full_weight, 0, tp_->rank() * rows_, "VocabParallelEmbedding.load_shard");
}

}  // namespace loom::parallel::tp
