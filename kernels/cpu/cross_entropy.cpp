// kernels/cpu/cross_entropy.cpp — CPU fused softmax cross-entropy (Note [Cross-entropy kernel
// contract] in kernels/cross_entropy.h). Targets are widened to int64 and checked serially
// first (threads must not throw); then rows are processed in parallel, one writer per row.
#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cross_entropy_checks.h"

namespace loom::kernels::cpu {
namespace {

// targets (N) widened to int64; errors name the first row whose target is out of range.
std::vector<int64_t> checked_targets(const Tensor& targets, int64_t ignore_index, int64_t vocab,
                                     const char* name) {
  std::vector<int64_t> out(static_cast<size_t>(targets.numel()));
  LOOM_DISPATCH_INDEX(targets.dtype(), name, [&] {
    const index_t* p = targets.data<index_t>();
    for (size_t r = 0; r < out.size(); ++r) out[r] = static_cast<int64_t>(p[r]);
  });
  for (size_t r = 0; r < out.size(); ++r) {
    LOOM_CHECK(out[r] == ignore_index || (out[r] >= 0 && out[r] < vocab), name, ": target ", out[r],
               " at row ", r, " is outside [0, ", vocab, ") and is not ignore_index (",
               ignore_index, ")");
  }
  return out;
}

// log Σ_{j<n} exp(x_j), with the max and the sum in double.
template <typename T>
double row_lse(const T* x, int64_t n) {
  T mt = x[0];
#pragma omp simd reduction(max : mt)
  for (int64_t j = 1; j < n; ++j) mt = x[j] > mt ? x[j] : mt;
  const double m = static_cast<double>(mt);
  if (std::isinf(m)) return m;  // all −inf (or a +inf logit): exp below would give NaN
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < n; ++j) acc += std::exp(static_cast<double>(x[j]) - m);
  return m + std::log(acc);
}

template <typename T>
void forward_typed(const T* x, const std::vector<int64_t>& tgt, int64_t ignore_index, int64_t vp,
                   int64_t vocab, T* loss, T* lse) {
  const int64_t n = static_cast<int64_t>(tgt.size());
  parallel_for(n, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(vp, 1)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t r = lo; r < hi; ++r) {
                   if (tgt[r] == ignore_index) {
                     loss[r] = T(0);
                     lse[r] = T(0);
                     continue;
                   }
                   const T* row = x + r * vp;
                   const double l = row_lse(row, vocab);
                   lse[r] = static_cast<T>(l);
                   loss[r] = static_cast<T>(l - static_cast<double>(row[tgt[r]]));
                 }
               });
}

void cross_entropy_forward_cpu(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                               int64_t vocab_size, Tensor& loss, Tensor& lse) {
  const char* name = "cross_entropy_forward";
  check_logits_targets(logits, targets, vocab_size, name);
  check_row_buffer(loss, logits.size(0), logits.dtype(), name, "loss");
  check_row_buffer(lse, logits.size(0), logits.dtype(), name, "lse");
  const std::vector<int64_t> tgt = checked_targets(targets, ignore_index, vocab_size, name);
  LOOM_DISPATCH_FLOAT(logits.dtype(), name, [&] {
    forward_typed<scalar_t>(logits.data<scalar_t>(), tgt, ignore_index, logits.size(1), vocab_size,
                            loss.data<scalar_t>(), lse.data<scalar_t>());
  });
}

// d (n) += g · exp(x − lse): the softmax part of a row's gradient. (glibc offers vector exp
// only under -ffast-math, so without it this loop stays scalar.)
template <typename T>
void add_scaled_softmax(const T* x, T lse, T g, int64_t n, T* d) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) d[j] += std::exp(x[j] - lse) * g;
}

template <typename T>
void backward_typed(const T* x, const std::vector<int64_t>& tgt, const T* lse, T g,
                    int64_t ignore_index, int64_t vp, int64_t vocab, T* dx) {
  const int64_t n = static_cast<int64_t>(tgt.size());
  parallel_for(n, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(vp, 1)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t r = lo; r < hi; ++r) {
                   if (tgt[r] == ignore_index) continue;
                   add_scaled_softmax(x + r * vp, lse[r], g, vocab, dx + r * vp);
                   dx[r * vp + tgt[r]] -= g;
                 }
               });
}

void cross_entropy_backward_cpu(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                const Tensor& dloss, double grad_scale, int64_t ignore_index,
                                int64_t vocab_size, Tensor& dlogits) {
  const char* name = "cross_entropy_backward";
  check_logits_targets(logits, targets, vocab_size, name);
  check_row_buffer(lse, logits.size(0), logits.dtype(), name, "lse");
  check_backward_args(logits, lse, dloss, dlogits, name);
  const std::vector<int64_t> tgt = checked_targets(targets, ignore_index, vocab_size, name);
  LOOM_DISPATCH_FLOAT(logits.dtype(), name, [&] {
    const scalar_t g =
        static_cast<scalar_t>(static_cast<double>(dloss.data<scalar_t>()[0]) * grad_scale);
    backward_typed<scalar_t>(logits.data<scalar_t>(), tgt, lse.data<scalar_t>(), g, ignore_index,
                             logits.size(1), vocab_size, dlogits.data<scalar_t>());
  });
}

// Note [Vocab-parallel cross-entropy kernels] in kernels/cross_entropy.h. Targets are global
// ids: only their range against the global vocabulary is unknown here, so they are checked
// against [0, ∞) and ignore_index; the op checks them against the real vocabulary.
std::vector<int64_t> global_targets(const Tensor& targets, int64_t ignore_index, const char* name) {
  return checked_targets(targets, ignore_index, std::numeric_limits<int64_t>::max(), name);
}

void vocab_parallel_ce_forward_cpu(const Tensor& logits, const Tensor& targets,
                                   int64_t ignore_index, int64_t vocab_start, int64_t vocab_valid,
                                   Tensor& lse_local, Tensor& target_logit) {
  const char* name = "vocab_parallel_ce_forward";
  check_logits_targets(logits, targets, vocab_valid, name);
  check_shard(logits, vocab_start, vocab_valid, name);
  check_row_buffer(lse_local, logits.size(0), logits.dtype(), name, "lse_local");
  check_row_buffer(target_logit, logits.size(0), logits.dtype(), name, "target_logit");
  const std::vector<int64_t> tgt = global_targets(targets, ignore_index, name);
  const int64_t vp = logits.size(1);
  LOOM_DISPATCH_FLOAT(logits.dtype(), name, [&] {
    const scalar_t* x = logits.data<scalar_t>();
    scalar_t* lse = lse_local.data<scalar_t>();
    scalar_t* tl = target_logit.data<scalar_t>();
    parallel_for(static_cast<int64_t>(tgt.size()), std::max<int64_t>(1, kElementGrain / vp),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t r = lo; r < hi; ++r) {
                     lse[r] = scalar_t(0);
                     tl[r] = scalar_t(0);
                     if (tgt[r] == ignore_index) continue;
                     lse[r] = static_cast<scalar_t>(row_lse(x + r * vp, vocab_valid));
                     const int64_t j = tgt[r] - vocab_start;
                     if (j >= 0 && j < vocab_valid) tl[r] = x[r * vp + j];
                   }
                 });
  });
}

void vocab_parallel_ce_backward_cpu(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                    const Tensor& dloss, double grad_scale, int64_t ignore_index,
                                    int64_t vocab_start, int64_t vocab_valid, Tensor& dlogits) {
  const char* name = "vocab_parallel_ce_backward";
  check_logits_targets(logits, targets, vocab_valid, name);
  check_shard(logits, vocab_start, vocab_valid, name);
  check_row_buffer(lse, logits.size(0), logits.dtype(), name, "lse");
  check_backward_args(logits, lse, dloss, dlogits, name);
  const std::vector<int64_t> tgt = global_targets(targets, ignore_index, name);
  const int64_t vp = logits.size(1);
  LOOM_DISPATCH_FLOAT(logits.dtype(), name, [&] {
    const scalar_t g =
        static_cast<scalar_t>(static_cast<double>(dloss.data<scalar_t>()[0]) * grad_scale);
    const scalar_t* x = logits.data<scalar_t>();
    const scalar_t* l = lse.data<scalar_t>();
    scalar_t* dx = dlogits.data<scalar_t>();
    parallel_for(static_cast<int64_t>(tgt.size()), std::max<int64_t>(1, kElementGrain / vp),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t r = lo; r < hi; ++r) {
                     if (tgt[r] == ignore_index) continue;
                     add_scaled_softmax(x + r * vp, l[r], g, vocab_valid, dx + r * vp);
                     const int64_t j = tgt[r] - vocab_start;
                     if (j >= 0 && j < vocab_valid) dx[r * vp + j] -= g;
                   }
                 });
  });
}

// Note [Vocab-parallel lse combine] in kernels/cross_entropy.h: rows in parallel (one writer
// each), then the mean serially in row order, as the op's host loop did before this kernel.
void vocab_parallel_lse_combine_cpu(const Tensor& lses, const Tensor& target_logit,
                                    const Tensor& targets, int64_t ignore_index, int64_t vocab_size,
                                    Tensor& lse, Tensor& row_loss, Tensor& loss,
                                    Tensor& inv_count) {
  const char* name = "vocab_parallel_lse_combine";
  check_lse_combine_args(lses, target_logit, targets, vocab_size, lse, row_loss, loss, inv_count,
                         name);
  const int64_t g = lses.size(0), n = lses.size(1);
  const DType dt = lses.dtype();
  const std::vector<int64_t> tgt = checked_targets(targets, ignore_index, vocab_size, name);
  LOOM_DISPATCH_FLOAT(dt, name, [&] {
    const scalar_t* ls = lses.data<scalar_t>();
    const scalar_t* tl = target_logit.data<scalar_t>();
    scalar_t* out = lse.data<scalar_t>();
    double* rl = row_loss.data<double>();
    parallel_for(n, std::max<int64_t>(1, kElementGrain / g), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        if (tgt[static_cast<size_t>(r)] == ignore_index) {
          out[r] = scalar_t(0);
          rl[r] = 0.0;
          continue;
        }
        double m = -INFINITY;
        for (int64_t q = 0; q < g; ++q) m = std::max(m, static_cast<double>(ls[q * n + r]));
        double s = 0.0;
        for (int64_t q = 0; q < g; ++q) s += std::exp(static_cast<double>(ls[q * n + r]) - m);
        const double l = m + std::log(s);
        out[r] = static_cast<scalar_t>(l);
        rl[r] = l - static_cast<double>(tl[r]);
      }
    });
    double total = 0.0;
    int64_t count = 0;
    for (int64_t r = 0; r < n; ++r) {
      if (tgt[static_cast<size_t>(r)] == ignore_index) continue;
      total += rl[r];
      ++count;
    }
    loss.data<scalar_t>()[0] =
        static_cast<scalar_t>(count > 0 ? total / static_cast<double>(count) : 0.0);
    inv_count.data<double>()[0] = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(vocab_parallel_lse_combine, kCpu, vocab_parallel_lse_combine_cpu);
LOOM_REGISTER_KERNEL(vocab_parallel_ce_forward, kCpu, vocab_parallel_ce_forward_cpu);
LOOM_REGISTER_KERNEL(vocab_parallel_ce_backward, kCpu, vocab_parallel_ce_backward_cpu);
LOOM_REGISTER_KERNEL(cross_entropy_forward, kCpu, cross_entropy_forward_cpu);
LOOM_REGISTER_KERNEL(cross_entropy_backward, kCpu, cross_entropy_backward_cpu);

}  // namespace loom::kernels::cpu
