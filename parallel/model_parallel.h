// parallel/model_parallel.h — MeshModelParallel: the ModelParallel (layers/model_parallel.h) of
// one rank, over its tensor-parallel and context-parallel groups: parallel/tp layers, ring
// attention (parallel/cp) and the vocab-parallel, context-averaged loss. The communicators
// (usually a ParallelContext's tp() and cp()) must outlive every model built with it.
//
// Note [Gradients of replicated parameters]: parameters that every TP rank holds whole (norm
// weights and biases, a row-parallel layer's bias, wpe) get identical gradients on every TP
// rank without sequence parallelism; with it each rank's activations are a sequence chunk, so
// those parameters are used through sequence_region_param (copy_to_region: the gradient is
// summed over the TP group in backward) and still arrive complete. Under context parallelism
// every parameter gets only this rank's tokens' share: those are summed over the cp group
// together with data parallelism's reduction (the model never reduces over cp itself).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "layers/model_parallel.h"
#include "parallel/comm/communicator.h"
#include "parallel/tp/layers.h"

namespace loom::parallel {

class MeshModelParallel final : public ModelParallel {
 public:
  MeshModelParallel(Communicator& tp, Communicator& cp, bool sequence_parallel);

  int tp_size() const override { return tp_->size(); }
  bool sequence_parallel() const override { return sequence_parallel_; }
  std::unique_ptr<LinearLayer> column_linear(int64_t in, const std::vector<int64_t>& segments,
                                             bool bias, DType dtype, Device device) const override;
  std::unique_ptr<LinearLayer> row_linear(int64_t in, int64_t out, bool bias, DType dtype,
                                          Device device) const override;
  std::unique_ptr<EmbeddingLayer> vocab_embedding(int64_t rows, int64_t dim, DType dtype,
                                                  Device device) const override;
  Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v) const override;
  Tensor sequence_chunk(const Tensor& x, int64_t dim) const override;
  Tensor activation_rows(const Tensor& positions) const override;
  int64_t sequence_length(int64_t local_len) const override;
  Tensor sequence_region_param(const Tensor& p) const override;
  Tensor head_input(const Tensor& x) const override;
  Tensor loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
              int64_t vocab_size) const override;

  Communicator& tp() const { return *tp_; }
  Communicator& cp() const { return *cp_; }
  // Where the TP layers built from now on (and those built before) report their GEMM spans
  // (parallel/tp/layers.h); an empty function stops the reports. For the profiler.
  void set_span_sink(tp::SpanSink sink) { *spans_ = std::move(sink); }

 private:
  Communicator* tp_;
  Communicator* cp_;
  bool sequence_parallel_;
  std::shared_ptr<tp::SpanSink> spans_ =
      std::make_shared<tp::SpanSink>();  // shared with the layers
};

}  // namespace loom::parallel
