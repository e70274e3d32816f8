// parallel/model_parallel.h — MeshModelParallel: the ModelParallel (layers/model_parallel.h) of
// one rank, over its tensor-parallel and context-parallel groups: parallel/tp layers, ring
// attention (parallel/cp) and the vocab-parallel, context-averaged loss. The communicators
// (usually a ParallelContext's tp() and cp()) must outlive every model built with it.
//
// Note [Gradients of replicated parameters]: parameters that every TP rank holds whole (norm
// weights and biases, a row-parallel layer's bias, wpe) get identical gradients on every TP
// rank without sequence parallelism, but only this rank's sequence chunk's share with it; and
// every parameter gets only this rank's tokens' share under context parallelism. The trainer
// sums those over the TP group (sequence_parallel_grads) and over the cp group (with dp,
// as data parallelism does); the model itself never reduces a parameter gradient.
#pragma once

#include <memory>
#include <vector>

#include "layers/model_parallel.h"
#include "parallel/comm/communicator.h"

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
  Tensor head_input(const Tensor& x) const override;
  Tensor loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
              int64_t vocab_size) const override;

  Communicator& tp() const { return *tp_; }
  Communicator& cp() const { return *cp_; }

 private:
  Communicator* tp_;
  Communicator* cp_;
  bool sequence_parallel_;
};

// The parameters of `model` whose gradients are partial over the TP group under sequence
// parallelism (Note [Gradients of replicated parameters]): every parameter not inside a
// tensor-parallel layer, and row-parallel biases. Empty without sequence parallelism.
std::vector<Tensor> sequence_parallel_params(const Module& model, const ModelParallel& mp);
// Whether `p` (a parameter of a model built with a MeshModelParallel) lives in a tensor-parallel
// layer as this rank's part (so a norm over all parameters sums its square over the TP group)
// rather than replicated. With a TP group of one every part is the whole tensor.
bool is_tensor_parallel_shard(const Module& model, const Tensor& p);

}  // namespace loom::parallel
