// parallel/tp/layers.h — Megatron's tensor-parallel layers over a TP group: ColumnParallelLinear
// (output features split, per segment), RowParallelLinear (input features split) and
// VocabParallelEmbedding (table rows split), the LinearLayer / EmbeddingLayer implementations
// the mesh's linear factory hands to the model (parallel/mesh_layers.h, layers/
// build_context.h). They keep Linear's and
// Embedding's parameter names ("weight", "bias") and layouts, holding only this rank's part:
// for a column layer with segments (the fused qkv: q, k, v rows) that part is this rank's
// chunk of each segment, concatenated. load_shard copies a part out of the unsharded tensor;
// init() draws the unsharded tensor as the single-device layer does and keeps the part.
// With sequence_parallel the activations outside the column→row pair are split along the
// sequence (dim 1 of (B, T, C)): the column layer all-gathers them and the row layer (and the
// embedding) reduce-scatter instead of all-reduce. A row layer's bias (replicated) then meets
// only this rank's chunk, so it is used through copy_to_region: its gradient is summed over
// the group in backward and arrives complete.
//
// Each layer's GEMMs overlap its TP communication wherever the dependency allows (Note [TP
// communication overlap] in parallel/tp/layers.cpp); with a SpanSink the layers report their GEMM
// spans, which the profiler draws beside the communicators' events, so the overlap shows in a
// trace.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "layers/build_context.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::tp {

// Receives a named compute span [begin, end) of a TP layer (e.g. "tp row: GEMM chunk"), on the
// compute thread. An empty function (or a null pointer) reports nothing.
using SpanSink =
    std::function<void(const std::string& what, std::chrono::steady_clock::time_point begin,
                       std::chrono::steady_clock::time_point end)>;
using SpanSinkPtr = std::shared_ptr<const SpanSink>;

class ColumnParallelLinear : public LinearLayer {
 public:
  // Out features in `segments` (summing to out), each split evenly: weight [tp-sharded dim 0,
  // per segment] (out/tp, in); bias likewise (out/tp).
  ColumnParallelLinear(int64_t in_features, std::vector<int64_t> segments, bool bias,
                       Communicator& tp, bool sequence_parallel, DType dtype = DType::kF32,
                       Device device = {}, SpanSinkPtr spans = nullptr);
  // x (B, T, in) replicated — or (B, T/tp, in) with sequence_parallel — → (B, T, out/tp).
  Tensor forward(const Tensor& x) const override;
  void init(Generator& gen, double std) override;
  void zero_rows_from(int64_t global_row) override;
  // Copies this rank's rows of the full weight (out, in) and bias (out) (bias may be undefined).
  void load_shard(const Tensor& full_weight, const Tensor& full_bias);
  const Tensor& weight() const override { return weight_; }
  const Tensor& bias() const override { return bias_; }

 private:
  // This rank's part of a full tensor whose dim 0 is the out features.
  Tensor part_of(const Tensor& full) const;

  Communicator* tp_;
  bool sequence_parallel_;
  std::vector<int64_t>
      segments_;  // Note [Column-parallel backward overlap] in parallel/tp/layers.cpp
  int64_t in_features_;
  Tensor weight_, bias_;
  SpanSinkPtr spans_;
};

class RowParallelLinear : public LinearLayer {
 public:
  // weight [tp-sharded dim 1] (out, in/tp); bias replicated (out).
  RowParallelLinear(int64_t in_features, int64_t out_features, bool bias, Communicator& tp,
                    bool sequence_parallel, DType dtype = DType::kF32, Device device = {},
                    SpanSinkPtr spans = nullptr);
  // x (B, T, in/tp) → (B, T, out) replicated — or (B, T/tp, out) with sequence_parallel.
  Tensor forward(const Tensor& x) const override;
  void init(Generator& gen, double std) override;
  void zero_rows_from(int64_t global_row) override;
  // Copies columns [rank·in/tp, (rank+1)·in/tp) of the full weight (out, in), and the bias.
  void load_shard(const Tensor& full_weight, const Tensor& full_bias);
  const Tensor& weight() const override { return weight_; }
  const Tensor& bias() const override { return bias_; }

 private:
  Communicator* tp_;
  bool sequence_parallel_;
  int64_t in_features_;
  Tensor weight_, bias_;
  SpanSinkPtr spans_;
};

class VocabParallelEmbedding : public EmbeddingLayer {
 public:
  // weight [tp-sharded dim 0] (Vp/tp, C): rows [rank·Vp/tp, (rank+1)·Vp/tp).
  VocabParallelEmbedding(int64_t num_embeddings, int64_t dim, Communicator& tp,
                         bool sequence_parallel, DType dtype = DType::kF32, Device device = {});
  // ids (B, T) global → (B, T, C) replicated — or (B, T/tp, C) with sequence_parallel.
  Tensor forward(const Tensor& ids) const override;
  void init(Generator& gen, double std, int64_t zero_from) override;
  void load_shard(const Tensor& full_weight);
  const Tensor& weight() const override { return weight_; }

 private:
  Communicator* tp_;
  bool sequence_parallel_;
  int64_t rows_;  // per rank
  Tensor weight_;
};

}  // namespace loom::parallel::tp
