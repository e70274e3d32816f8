// parallel/tp/layers.h — Megatron's tensor-parallel layers over a TP group: ColumnParallelLinear
// (output features split), RowParallelLinear (input features split) and VocabParallelEmbedding
// (table rows split). They keep Linear's and Embedding's parameter names ("weight", "bias") and
// layouts, holding only this rank's slice, so a checkpoint shard is a slice of the unsharded
// tensor (load_shard copies one in). With sequence_parallel the activations outside the
// column→row pair are split along the sequence (dim 1 of (B, T, C)): the column layer
// all-gathers them and the row layer (and the embedding) reduce-scatter instead of all-reduce.
// Gradients of replicated parameters that see only this rank's sequence chunk (a row layer's
// bias under sequence parallelism) are partial: sequence_parallel_grads() lists them for the
// trainer to all-reduce over the TP group (as Megatron does for norm weights).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "layers/module.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::tp {

class ColumnParallelLinear : public Module {
 public:
  // weight [tp-sharded dim 0] (out/tp, in); bias [tp-sharded dim 0] (out/tp).
  ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias, Communicator& tp,
                       bool sequence_parallel, DType dtype = DType::kF32, Device device = {});
  // x (B, T, in) replicated — or (B, T/tp, in) with sequence_parallel — → (B, T, out/tp).
  Tensor forward(const Tensor& x) const;
  // Copies rows [rank·out/tp, (rank+1)·out/tp) of the full weight (out, in) and bias (out).
  void load_shard(const Tensor& full_weight, const Tensor& full_bias);
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  Communicator* tp_;
  bool sequence_parallel_;
  Tensor weight_, bias_;
};

class RowParallelLinear : public Module {
 public:
  // weight [tp-sharded dim 1] (out, in/tp); bias replicated (out).
  RowParallelLinear(int64_t in_features, int64_t out_features, bool bias, Communicator& tp,
                    bool sequence_parallel, DType dtype = DType::kF32, Device device = {});
  // x (B, T, in/tp) → (B, T, out) replicated — or (B, T/tp, out) with sequence_parallel.
  Tensor forward(const Tensor& x) const;
  // Copies columns [rank·in/tp, (rank+1)·in/tp) of the full weight (out, in), and the bias.
  void load_shard(const Tensor& full_weight, const Tensor& full_bias);
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  std::vector<Tensor> sequence_parallel_grads() const;

 private:
  Communicator* tp_;
  bool sequence_parallel_;
  Tensor weight_, bias_;
};

class VocabParallelEmbedding : public Module {
 public:
  // weight [tp-sharded dim 0] (Vp/tp, C): rows [rank·Vp/tp, (rank+1)·Vp/tp).
  VocabParallelEmbedding(int64_t num_embeddings, int64_t dim, Communicator& tp,
                         bool sequence_parallel, DType dtype = DType::kF32, Device device = {});
  // ids (B, T) global → (B, T, C) replicated — or (B, T/tp, C) with sequence_parallel.
  Tensor forward(const Tensor& ids) const;
  void load_shard(const Tensor& full_weight);
  const Tensor& weight() const { return weight_; }

 private:
  Communicator* tp_;
  bool sequence_parallel_;
  int64_t rows_;  // per rank
  Tensor weight_;
};

}  // namespace loom::parallel::tp
