// tests/conformance/cases/embedding.cpp — conformance cases of embedding (core/ops/embedding.h):
// a one-row table, one-column rows, more ids than rows (repeated ids accumulate in the
// backward), ids of rank 1 to 3, every index dtype. The ids travel with the table (device ids
// on a device: the device-side check).
#include "core/ops/embedding.h"

#include "tests/conformance/conformance.h"

namespace loom::conformance {

LOOM_CONFORMANCE_CASES(embedding) {
  struct Table {
    int64_t vocab, cols;
    Shape ids;
    DType id_dtype;
  };
  for (const Table& t : {Table{1, 3, {5}, DType::kI64}, Table{17, 3, {2, 9}, DType::kI32},
                         Table{3, 65, {17}, DType::kU16}, Table{65, 1, {1}, DType::kU32},
                         Table{5, 17, {2, 3, 4}, DType::kI64}}) {
    cases.push_back({.name = "V" + std::to_string(t.vocab) + "_C" + std::to_string(t.cols) +
                             "_ids" + shape_name(t.ids) + "_" + dtype_name(t.id_dtype),
                     .kernels = {"embedding_forward", "embedding_backward"},
                     .inputs =
                         [t](Generator& gen) {
                           Tensor ids = randint(t.ids, 0, t.vocab, gen, t.id_dtype);
                           return Inputs{ids, grad_input({t.vocab, t.cols}, gen)};
                         },
                     .op = [](const Inputs& in) { return Outputs{ops::embedding(in[0], in[1])}; }});
  }
}

}  // namespace loom::conformance
