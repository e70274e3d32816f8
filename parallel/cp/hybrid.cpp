// parallel/cp/hybrid.cpp — hybrid_attention (see parallel/cp/hybrid.h, Note [Hybrid context
// parallelism]): Ulysses' exchange over one group around ring attention over the other.
#include "parallel/cp/hybrid.h"

#include "parallel/cp/ring_attention.h"
#include "parallel/cp/ulysses.h"

namespace loom::parallel::cp {

Tensor hybrid_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                        Communicator& ulysses, Communicator& ring) {
  // The gathered tokens are coarse chunks j and 2r−1−j in order: ring rank j's local sequence.
  return ulysses_around(q, k, v, ulysses,
                        [&](const Tensor& qs, const Tensor& ks, const Tensor& vs) {
                          return ring_attention(qs, ks, vs, scale, ring);
                        });
}

}  // namespace loom::parallel::cp
