// parallel/mesh_layers.cpp — mesh_layer_context (see the header): the tensor-parallel linear
// factory, the sequence/context-parallel layout, ring, Ulysses or hybrid attention and the
// vocab-parallel loss.
#include "parallel/mesh_layers.h"

#include <memory>
#include <utility>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "parallel/cp/hybrid.h"
#include "parallel/cp/ring_attention.h"
#include "parallel/cp/ulysses.h"
#include "parallel/tp/comm_ops.h"
#include "parallel/tp/cross_entropy.h"

namespace loom::parallel {
namespace {

// Megatron's layers over the TP group; under sequence parallelism the activations between them
// are sequence chunks (Note [Sequence-parallel region ops] in layers/build_context.h).
class TensorParallelLinear final : public LinearFactory {
 public:
  TensorParallelLinear(Communicator& tp, bool sequence_parallel, tp::SpanSinkPtr spans)
      : tp_(&tp), sequence_parallel_(sequence_parallel), spans_(std::move(spans)) {}

  int feature_split() const override { return tp_->size(); }
  std::unique_ptr<LinearLayer> column(int64_t in, const std::vector<int64_t>& segments, bool bias,
                                      DType dtype, Device device) const override {
    return std::make_unique<tp::ColumnParallelLinear>(in, segments, bias, *tp_, sequence_parallel_,
                                                      dtype, device, spans_);
  }
  std::unique_ptr<LinearLayer> row(int64_t in, int64_t out, bool bias, DType dtype,
                                   Device device) const override {
    return std::make_unique<tp::RowParallelLinear>(in, out, bias, *tp_, sequence_parallel_, dtype,
                                                   device, spans_);
  }
  std::unique_ptr<EmbeddingLayer> vocab_embedding(int64_t rows, int64_t dim, DType dtype,
                                                  Device device) const override {
    return std::make_unique<tp::VocabParallelEmbedding>(rows, dim, *tp_, sequence_parallel_, dtype,
                                                        device);
  }
  // Note [Gradients of replicated parameters].
  Tensor replicated_param(const Tensor& p) const override {
    return sequence_parallel_ ? tp::copy_to_region(p, *tp_) : p;
  }
  // Each TP rank computes its own heads: the gradient is summed over the TP group, with or
  // without sequence parallelism.
  Tensor head_param(const Tensor& p) const override { return tp::copy_to_region(p, *tp_); }
  // All-gathered along the sequence under sequence parallelism, else replicated with its
  // gradient summed over the TP group.
  Tensor column_input(const Tensor& x) const override {
    return sequence_parallel_ ? tp::gather_from_sequence(x, *tp_, 1) : tp::copy_to_region(x, *tp_);
  }

 private:
  Communicator* tp_;
  bool sequence_parallel_;
  tp::SpanSinkPtr spans_;  // shared with the layers
};

// This rank's tokens are its cp part (the positions the caller passes, Note [Causal load
// balancing]); under sequence parallelism its activation rows are this TP rank's contiguous
// chunk of them, as the embeddings' reduce-scatter leaves them.
class MeshSequenceLayout final : public SequenceLayout {
 public:
  MeshSequenceLayout(Communicator& tp, Communicator& cp, bool sequence_parallel)
      : tp_(&tp), cp_(&cp), sequence_parallel_(sequence_parallel) {}

  Tensor local_sequence(const Tensor& x, int64_t dim) const override {
    return cp_->size() > 1 ? cp::shard_sequence(x, dim, cp_->rank(), cp_->size()) : x;
  }
  // Defined also without cp: under sequence parallelism the rows are a part of them.
  Tensor local_positions(int64_t sequence_length) const override {
    return cp::cp_positions(sequence_length, cp_->rank(), cp_->size());
  }
  Tensor row_positions(const Tensor& positions) const override {
    return sequence_parallel_ ? tp::chunk_dim(positions, *tp_, 0) : positions;
  }
  Tensor dropout_rows(const Tensor& positions) const override {
    if (!sequence_parallel_ && cp_->size() == 1) return Tensor();
    LOOM_CHECK(positions.dim() == 1, "dropout_rows: positions must be (T), got ",
               shape_str(positions.shape()));
    const Tensor rows = sequence_parallel_ ? row_positions(positions) : positions.detach();
    return ops::to_dtype(rows, DType::kI64);
  }
  int64_t sequence_length(int64_t local_tokens) const override {
    return local_tokens * cp_->size();
  }
  int64_t local_tokens(int64_t rows) const override {
    return sequence_parallel_ ? rows * tp_->size() : rows;
  }

 private:
  Communicator* tp_;
  Communicator* cp_;
  bool sequence_parallel_;
};

// Note [Context-parallel loss]: each cp rank holds a different part of every sequence, so its
// mean is rescaled by its share of the non-ignored tokens: loss_r · n_r / Σ n. The sum of the
// group's losses is then the mean over all tokens, and each rank's backward is its share.
Tensor mesh_loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                 int64_t vocab_size, Communicator& tp, Communicator& cp) {
  Tensor l = tp::vocab_parallel_cross_entropy(logits, targets, ignore_index, vocab_size, tp);
  if (cp.size() == 1) return l;
  // The count is read from the targets on the host. The trainer always passes host targets
  // (Batch is CPU, data/loader.h, also through the pipeline), so this reads host memory and
  // never waits for a device; a caller passing device targets pays a copy to the host here.
  const std::vector<double> t = targets.to(Device::cpu()).contiguous().to_vector();
  double mine = 0;
  for (double id : t) mine += static_cast<int64_t>(id) != ignore_index ? 1.0 : 0.0;
  const double total = tp::all_reduce_sum(Tensor::full({1}, mine, DType::kF64), cp).item();
  return ops::scale(l, total > 0 ? mine / total : 0.0);
}

}  // namespace

LayerContext mesh_layer_context(Communicator& tp, Communicator& cp, bool sequence_parallel,
                                tp::SpanSink spans, CpAttention cp_attention,
                                Communicator* cp_ulysses, Communicator* cp_ring) {
  LOOM_CHECK(
      cp_attention != CpAttention::kHybrid || (cp_ulysses != nullptr && cp_ring != nullptr &&
                                               cp_ulysses->size() * cp_ring->size() == cp.size()),
      "mesh_layer_context: hybrid attention needs the cp group's split into a Ulysses "
      "group and a ring whose sizes multiply to cp ",
      cp.size());
  LayerContext ctx;
  ctx.linear = std::make_shared<const TensorParallelLinear>(
      tp, sequence_parallel, std::make_shared<const tp::SpanSink>(std::move(spans)));
  // Heads split over tp need nothing for each row's first key (doc_start is per token). Under
  // cp it is the whole sequence's (Note [Sliding window] in layers/transformer.cpp): Ulysses
  // attends whole sequences and takes it; ring attention's blocks have no such mask yet, nor
  // has the hybrid, whose ring holds parts of the sequence.
  ctx.attention = [c = &cp, cp_attention, cp_ulysses, cp_ring](
                      const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc_start) {
    if (c->size() == 1) return ops::causal_attention(q, k, v, 0.0, doc_start);
    if (cp_attention == CpAttention::kUlysses)
      return cp::ulysses_attention(q, k, v, 0.0, *c, doc_start);
    LOOM_CHECK(!doc_start.defined(),
               "packed documents are not supported with context parallelism (parallel.cp > 1) "
               "yet: ring attention has no document mask (cp group of ",
               c->size(), "; parallel.cp_attention: ulysses takes a sliding window)");
    if (cp_attention == CpAttention::kHybrid)
      return cp::hybrid_attention(q, k, v, 0.0, *cp_ulysses, *cp_ring);
    return cp::ring_attention(q, k, v, 0.0, *c);
  };
  ctx.loss = [t = &tp, c = &cp](const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                int64_t vocab_size) {
    return mesh_loss(logits, targets, ignore_index, vocab_size, *t, *c);
  };
  ctx.layout = std::make_shared<const MeshSequenceLayout>(tp, cp, sequence_parallel);
  return ctx;
}

}  // namespace loom::parallel
