// layers/embedding.h — Embedding: a (num_embeddings, dim) lookup table (token and learned
// position embeddings). Gradients reach only the rows that were looked up.
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "core/tensor.h"
#include "layers/module.h"

namespace loom {

class Embedding : public Module {
 public:
  // weight (num_embeddings, dim).
  Embedding(int64_t num_embeddings, int64_t dim, DType dtype = DType::kF32, Device device = {});
  // ids (…) integer → (…, dim).
  Tensor forward(const Tensor& ids) const;
  void init(Generator& gen, double std);
  const Tensor& weight() const { return weight_; }

 private:
  Tensor weight_;
};

}  // namespace loom
