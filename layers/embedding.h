// layers/embedding.h — Embedding: a (num_embeddings, dim) lookup table (token and learned
// position embeddings). Gradients reach only the rows that were looked up.
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "core/tensor.h"
#include "layers/build_context.h"

namespace loom {

class Embedding : public EmbeddingLayer {
 public:
  // weight (num_embeddings, dim).
  Embedding(int64_t num_embeddings, int64_t dim, DType dtype = DType::kF32, Device device = {});
  // ids (…) integer → (…, dim).
  Tensor forward(const Tensor& ids) const override;
  void init(Generator& gen, double std);
  void init(Generator& gen, double std, int64_t zero_from) override;
  const Tensor& weight() const override { return weight_; }

 private:
  Tensor weight_;
};

}  // namespace loom
