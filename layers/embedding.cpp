// layers/embedding.cpp — Embedding (see layers/embedding.h).
#include "layers/embedding.h"

#include "core/ops/embedding.h"
#include "layers/init.h"

namespace loom {

Embedding::Embedding(int64_t num_embeddings, int64_t dim, DType dtype, Device device) {
  LOOM_CHECK(num_embeddings > 0 && dim > 0, "Embedding: sizes must be positive, got ",
             num_embeddings, " x ", dim);
  weight_ = register_parameter("weight", Tensor::zeros({num_embeddings, dim}, dtype, device));
}

// Looked up in the table's dtype, then cast (Note [Compute dtype] in layers/module.h).
Tensor Embedding::forward(const Tensor& ids) const { return compute(ops::embedding(ids, weight_)); }

void Embedding::init(Generator& gen, double std) { init::normal_(weight_, gen, std); }

void Embedding::init(Generator& gen, double std, int64_t zero_from) {
  init::normal_(weight_, gen, std);
  init::zero_rows_from_(weight_, zero_from);
}

}  // namespace loom
