// kernels/cpu/embedding.cpp — CPU embedding gather (forward) and scatter-add (backward), and the
// shard-local ids of a vocab-parallel lookup (vocab_parallel_ids). Ids are
// validated serially before any parallel region (an exception must not leave an OpenMP region).
// Backward groups token positions by id (a sort of (id, position) pairs, so order is fixed) and
// gives each weight row to one thread, summing its tokens in position order: deterministic with
// any thread count, no atomics.
#include "kernels/embedding.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace loom::kernels::cpu {
namespace {

int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(cols, 1));
}

// ids_checked is ignored by both: the CPU kernels always check (kernels/embedding.h).
void embedding_forward_cpu(const Tensor& ids, const Tensor& weight, Tensor& out,
                           bool /*ids_checked*/) {
  const int64_t n = ids.numel(), vocab = weight.size(0), cols = weight.size(1);
  LOOM_DISPATCH_FLOAT(weight.dtype(), "embedding_forward", [&] {
    LOOM_DISPATCH_INDEX(ids.dtype(), "embedding_forward", [&] {
      const index_t* pi = ids.data<index_t>();
      const scalar_t* pw = weight.data<scalar_t>();
      scalar_t* po = out.data<scalar_t>();
      check_embedding_ids(pi, n, vocab);
      parallel_for(n, row_grain(cols), [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          const scalar_t* src = pw + static_cast<int64_t>(pi[t]) * cols;
          scalar_t* dst = po + t * cols;
          LOOM_SIMD
          for (int64_t c = 0; c < cols; ++c) dst[c] = src[c];
        }
      });
    });
  });
}

// (id, position) pairs sorted by id then position; `starts` marks where each id's run begins
// (with a final sentinel at n).
template <typename I>
std::vector<std::pair<int64_t, int64_t>> group_by_id(const I* ids, int64_t n,
                                                     std::vector<int64_t>& starts) {
  std::vector<std::pair<int64_t, int64_t>> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = {static_cast<int64_t>(ids[i]), i};
  std::sort(order.begin(), order.end());
  starts.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || order[static_cast<size_t>(i)].first != order[static_cast<size_t>(i - 1)].first) {
      starts.push_back(i);
    }
  }
  starts.push_back(n);
  return order;
}

void embedding_backward_cpu(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                            bool /*ids_checked*/) {
  const int64_t n = ids.numel(), vocab = dweight.size(0), cols = dweight.size(1);
  LOOM_DISPATCH_FLOAT(dweight.dtype(), "embedding_backward", [&] {
    LOOM_DISPATCH_INDEX(ids.dtype(), "embedding_backward", [&] {
      const index_t* pi = ids.data<index_t>();
      check_embedding_ids(pi, n, vocab);
      const scalar_t* pd = dout.data<scalar_t>();
      scalar_t* pw = dweight.data<scalar_t>();
      std::vector<int64_t> starts;
      const auto order = group_by_id(pi, n, starts);
      const int64_t runs = static_cast<int64_t>(starts.size()) - 1;
      parallel_for(runs, row_grain(cols), [&](int64_t lo, int64_t hi) {
        std::vector<double> buf(static_cast<size_t>(cols));
        double* acc = buf.data();
        for (int64_t r = lo; r < hi; ++r) {
          std::fill(buf.begin(), buf.end(), 0.0);
          for (int64_t j = starts[r]; j < starts[r + 1]; ++j) {
            const scalar_t* src = pd + order[static_cast<size_t>(j)].second * cols;
            LOOM_SIMD
            for (int64_t c = 0; c < cols; ++c) acc[c] += src[c];
          }
          scalar_t* dst = pw + order[static_cast<size_t>(starts[r])].first * cols;
          LOOM_SIMD
          for (int64_t c = 0; c < cols; ++c) dst[c] += static_cast<scalar_t>(acc[c]);
        }
      });
    });
  });
}

// kernels/embedding.h: this rank's shard rows of each id, and a 0/1 mask of the ids it holds.
void vocab_parallel_ids_cpu(const Tensor& ids, int64_t vocab_start, int64_t rows, Tensor& local_ids,
                            Tensor& mask) {
  const char* name = "vocab_parallel_ids";
  const int64_t n = ids.numel();
  check_vocab_parallel_ids_args(ids, local_ids, mask);
  LOOM_DISPATCH_FLOAT(mask.dtype(), name, [&] {
    LOOM_DISPATCH_INDEX(ids.dtype(), name, [&] {
      const index_t* pi = ids.data<index_t>();
      int64_t* pl = local_ids.data<int64_t>();
      scalar_t* pm = mask.data<scalar_t>();
      parallel_for(n, kElementGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          const auto id = static_cast<int64_t>(pi[t]);
          const bool mine = id >= vocab_start && id < vocab_start + rows;
          pl[t] = mine ? id - vocab_start : 0;
          pm[t] = mine ? scalar_t(1) : scalar_t(0);
        }
      });
    });
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(embedding_forward, kCpu, embedding_forward_cpu);
LOOM_REGISTER_KERNEL(embedding_backward, kCpu, embedding_backward_cpu);
LOOM_REGISTER_KERNEL(vocab_parallel_ids, kCpu, vocab_parallel_ids_cpu);

}  // namespace loom::kernels::cpu
