// layers/model_parallel.h — the interface through which a parallel engine splits one model over
// ranks (tensor, sequence and context parallelism) without the layers ever seeing a
// communicator. The layers ask a ModelParallel for their linear and embedding layers and route
// the few activations that cross ranks through it; parallel/model_parallel.h implements it over
// a ParallelContext (Megatron's pattern: parallel layers replace plain ones by configuration,
// not by a second model definition). A null ModelParallel* everywhere means one device.
//
// LinearLayer / EmbeddingLayer are what the model holds: layers/linear.h and layers/embedding.h
// are the single-device ones, parallel/tp/layers.h the sharded ones. Their init() draws the
// FULL tensor exactly as the single-device layer would (same generator calls) and keeps this
// rank's part, so a sharded model starts as a slice of the single-device one.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "layers/module.h"

namespace loom {

// y = x·Wᵀ + b over some split of W (out, in).
class LinearLayer : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;
  // W ← N(0, std²) drawn as the full (out, in) matrix, b ← 0.
  virtual void init(Generator& gen, double std) = 0;
  virtual const Tensor& weight() const = 0;  // this rank's part
  virtual const Tensor& bias() const = 0;    // undefined without bias
  // Rows [global_row, out) of W ← 0 (the padded vocabulary rows of an LM head).
  virtual void zero_rows_from(int64_t global_row) = 0;
};

// A (rows, dim) lookup table over some split of its rows.
class EmbeddingLayer : public Module {
 public:
  virtual Tensor forward(const Tensor& ids) const = 0;  // ids (…) → (…, dim)
  // W ← N(0, std²) drawn as the full table; then global rows [zero_from, rows) ← 0.
  virtual void init(Generator& gen, double std, int64_t zero_from) = 0;
  virtual const Tensor& weight() const = 0;  // this rank's rows
};

class ModelParallel {
 public:
  virtual ~ModelParallel() = default;
  virtual int tp_size() const = 0;
  virtual bool sequence_parallel() const = 0;

  // Column-parallel: the out features come in `segments` (e.g. {q, k, v} rows), each split
  // evenly over the TP ranks; the output holds this rank's part of each, in segment order.
  // Its input is replicated, or sequence-sharded under sequence parallelism (gathered inside).
  virtual std::unique_ptr<LinearLayer> column_linear(int64_t in,
                                                     const std::vector<int64_t>& segments,
                                                     bool bias, DType dtype,
                                                     Device device) const = 0;
  // Row-parallel: in features split; the output is complete (summed over the TP ranks), or
  // this rank's sequence chunk of it under sequence parallelism.
  virtual std::unique_ptr<LinearLayer> row_linear(int64_t in, int64_t out, bool bias, DType dtype,
                                                  Device device) const = 0;
  // Vocab-parallel table (rows split); output as a row-parallel linear's.
  virtual std::unique_ptr<EmbeddingLayer> vocab_embedding(int64_t rows, int64_t dim, DType dtype,
                                                          Device device) const = 0;

  // Causal attention of this rank's q (B, Hq, T, D), k, v (B, Hkv, T, D): plain, or ring
  // attention over the context-parallel group (positions are then global, see parallel/cp).
  virtual Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v) const = 0;
  // Sequence parallelism: this rank's chunk of x along `dim` (not differentiable: positions),
  // and the all-gather of sequence-sharded activations (before the LM head).
  virtual Tensor sequence_chunk(const Tensor& x, int64_t dim) const = 0;
  // Dropout on block activations (B, R, C) under sequence or context parallelism (the rows form
  // of Note [Dropout mask], kernels/dropout.h): the global row indices (R) i64 of the rows this
  // rank holds, given the blocks' positions (the global token indices of this rank's context-
  // parallel part, on the activations' device), or an undefined tensor when the activations hold
  // the whole sequence (neither is on: the plain mask applies).
  virtual Tensor activation_rows(const Tensor& positions) const = 0;
  // The whole sequence's length, given the length of this rank's context-parallel part.
  virtual int64_t sequence_length(int64_t local_len) const = 0;
  // A replicated parameter used on this rank's sequence chunk (norm weights and biases, wpe):
  // identity forward; under sequence parallelism its gradient is summed over the TP group in
  // backward, so the parameter receives the complete gradient like every other parameter.
  virtual Tensor sequence_region_param(const Tensor& p) const = 0;
  // The LM head's input as a column-parallel layer takes it: all-gathered along the sequence
  // under sequence parallelism, else replicated with its gradient summed over the TP group.
  virtual Tensor head_input(const Tensor& x) const = 0;
  // The language-model loss of this rank's logits (B, T, Vp/tp): vocab-parallel cross-entropy,
  // scaled so that the SUM over the context-parallel group is the mean over all its tokens.
  virtual Tensor loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                      int64_t vocab_size) const = 0;
};

}  // namespace loom
