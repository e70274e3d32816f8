// parallel/model_parallel.cpp — MeshModelParallel (see the header).
#include "parallel/model_parallel.h"

#include <unordered_set>

#include "core/ops/attention.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "parallel/cp/ring_attention.h"
#include "parallel/tp/comm_ops.h"
#include "parallel/tp/cross_entropy.h"
#include "parallel/tp/layers.h"

namespace loom::parallel {

MeshModelParallel::MeshModelParallel(Communicator& tp, Communicator& cp, bool sequence_parallel)
    : tp_(&tp), cp_(&cp), sequence_parallel_(sequence_parallel) {}

std::unique_ptr<LinearLayer> MeshModelParallel::column_linear(int64_t in,
                                                              const std::vector<int64_t>& segments,
                                                              bool bias, DType dtype,
                                                              Device device) const {
  return std::make_unique<tp::ColumnParallelLinear>(in, segments, bias, *tp_, sequence_parallel_,
                                                    dtype, device, spans_);
}

std::unique_ptr<LinearLayer> MeshModelParallel::row_linear(int64_t in, int64_t out, bool bias,
                                                           DType dtype, Device device) const {
  return std::make_unique<tp::RowParallelLinear>(in, out, bias, *tp_, sequence_parallel_, dtype,
                                                 device, spans_);
}

std::unique_ptr<EmbeddingLayer> MeshModelParallel::vocab_embedding(int64_t rows, int64_t dim,
                                                                   DType dtype,
                                                                   Device device) const {
  return std::make_unique<tp::VocabParallelEmbedding>(rows, dim, *tp_, sequence_parallel_, dtype,
                                                      device);
}

Tensor MeshModelParallel::attention(const Tensor& q, const Tensor& k, const Tensor& v) const {
  if (cp_->size() == 1) return ops::causal_attention(q, k, v);
  return cp::ring_attention(q, k, v, 0.0, *cp_);
}

Tensor MeshModelParallel::sequence_chunk(const Tensor& x, int64_t dim) const {
  return tp::chunk_dim(x, *tp_, dim);
}

// The blocks' rows are the cp-local positions (Note [Causal load balancing]), of which sequence
// parallelism keeps this TP rank's contiguous chunk, as the embeddings' sequence_chunk does.
Tensor MeshModelParallel::activation_rows(const Tensor& positions) const {
  if (!sequence_parallel_ && cp_->size() == 1) return Tensor();
  LOOM_CHECK(positions.dim() == 1, "activation_rows: positions must be (T), got ",
             shape_str(positions.shape()));
  const Tensor rows = sequence_parallel_ ? sequence_chunk(positions, 0) : positions.detach();
  return ops::to_dtype(rows, DType::kI64);
}

int64_t MeshModelParallel::sequence_length(int64_t local_len) const {
  return local_len * cp_->size();
}

Tensor MeshModelParallel::sequence_region_param(const Tensor& p) const {
  return sequence_parallel_ ? tp::copy_to_region(p, *tp_) : p;
}

Tensor MeshModelParallel::head_input(const Tensor& x) const {
  return sequence_parallel_ ? tp::gather_from_sequence(x, *tp_, 1) : tp::copy_to_region(x, *tp_);
}

// Note [Context-parallel loss]: each cp rank holds a different part of every sequence, so its
// mean is rescaled by its share of the non-ignored tokens: loss_r · n_r / Σ n. The sum of the
// group's losses is then the mean over all tokens, and each rank's backward is its share.
Tensor MeshModelParallel::loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                               int64_t vocab_size) const {
  Tensor l = tp::vocab_parallel_cross_entropy(logits, targets, ignore_index, vocab_size, *tp_);
  if (cp_->size() == 1) return l;
  // The count is read from the targets on the host. The trainer always passes host targets
  // (Batch is CPU, data/loader.h, also through the pipeline), so this reads host memory and
  // never waits for a device; a caller passing device targets pays a copy to the host here.
  const std::vector<double> t = targets.to(Device::cpu()).contiguous().to_vector();
  double mine = 0;
  for (double id : t) mine += static_cast<int64_t>(id) != ignore_index ? 1.0 : 0.0;
  const double total = tp::all_reduce_sum(Tensor::full({1}, mine, DType::kF64), *cp_).item();
  return ops::scale(l, total > 0 ? mine / total : 0.0);
}

}  // namespace loom::parallel
