// kernels/cuda/cross_entropy.cu — CUDA fused softmax cross-entropy (Note [Cross-entropy kernel
// contract] in kernels/cross_entropy.h), its vocab-parallel form (Note [Vocab-parallel
// cross-entropy kernels]) and the combine of the group's statistics (Note [Vocab-parallel lse
// combine]). One block per row (the combine: one thread per row, in double, then one block for
// the mean); the forward makes one pass over the row with an online max/sum (never storing
// probabilities), the backward one pass that recomputes each probability from the saved lse.
// Rows are read in 16-byte vectors where the row's alignment allows. Math in f32 (f64 for f64
// logits); every reduction has a fixed order, so results are deterministic. Must not synchronise
// the host or allocate.
//
// Targets are validated on the host by the ops when they are there (core/ops/cross_entropy.cpp,
// parallel/tp/cross_entropy.cpp); a kernel cannot throw, so a row whose target is neither
// ignore_index nor in range gets NaN loss and lse in the forward and NaN gradients in the
// backward, never an out-of-bounds read (vocab-parallel: a negative target in the per-rank
// kernels, one outside [0, vocab_size) in the combine).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cross_entropy.h"
#include "kernels/cross_entropy_checks.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/dtype_convert.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr unsigned kThreads = 512;  // the per-row kernels' block (their __launch_bounds__)
constexpr unsigned kWarps = kThreads / 32;

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename A>
__device__ __forceinline__ A exp_acc(A x) {
  if constexpr (std::is_same_v<A, double>) {
    return ::exp(x);
  } else {
    return ::expf(x);
  }
}

template <typename A>
__device__ __forceinline__ A log_acc(A x) {
  if constexpr (std::is_same_v<A, double>) {
    return ::log(x);
  } else {
    return ::logf(x);
  }
}

// ---- 16-byte packs: kVec elements of T in one uint4 ----

template <typename T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

__device__ __forceinline__ uint32_t& word(uint4& p, int i) {
  return i == 0 ? p.x : i == 1 ? p.y : i == 2 ? p.z : p.w;
}

template <typename T>
__device__ __forceinline__ acc_t<T> get(uint4 p, int e) {
  if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float(word(p, e));
  } else if constexpr (std::is_same_v<T, double>) {
    const uint64_t bits = (static_cast<uint64_t>(word(p, 2 * e + 1)) << 32) | word(p, 2 * e);
    return __longlong_as_double(static_cast<long long>(bits));
  } else {
    const uint16_t bits = static_cast<uint16_t>(word(p, e / 2) >> (16 * (e % 2)));
    if constexpr (std::is_same_v<T, BFloat16>) {
      return bf16_bits_to_float(bits);
    } else {
      return f16_bits_to_float(bits);
    }
  }
}

template <typename T>
__device__ __forceinline__ void set(uint4& p, int e, acc_t<T> v) {
  if constexpr (std::is_same_v<T, float>) {
    word(p, e) = __float_as_uint(v);
  } else if constexpr (std::is_same_v<T, double>) {
    const auto bits = static_cast<uint64_t>(__double_as_longlong(v));
    word(p, 2 * e) = static_cast<uint32_t>(bits);
    word(p, 2 * e + 1) = static_cast<uint32_t>(bits >> 32);
  } else {
    const uint32_t bits = half_from_float<T>(v).bits;
    const int shift = 16 * (e % 2);
    uint32_t& w = word(p, e / 2);
    w = (w & ~(0xffffu << shift)) | (bits << shift);
  }
}

// Elements before the first 16-byte boundary of a row (at most n).
template <typename T>
__device__ __forceinline__ int64_t head_elements(const T* row, int64_t n) {
  const auto misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(row) % 16);
  const int64_t head = misalign == 0 ? 0 : (16 - misalign) / static_cast<int64_t>(sizeof(T));
  return head < n ? head : n;
}

// ---- the online max/sum pair ----

template <typename A>
struct MaxSum {
  A m;  // running max
  A s;  // Σ exp(x − m)
};

template <typename A>
__device__ __forceinline__ void add(MaxSum<A>& a, A x) {
  if (x > a.m) {
    a.s = a.s * exp_acc(a.m - x) + A(1);  // a.m == −inf: s is 0, exp gives 0
    a.m = x;
  } else if (x != -std::numeric_limits<A>::infinity()) {
    a.s += exp_acc(x - a.m);
  }
}

template <typename A>
__device__ __forceinline__ MaxSum<A> merge(MaxSum<A> a, MaxSum<A> b) {
  const A m = a.m > b.m ? a.m : b.m;
  if (m == -std::numeric_limits<A>::infinity()) return {m, A(0)};
  return {m, a.s * exp_acc(a.m - m) + b.s * exp_acc(b.m - m)};
}

// Block-wide merge in a fixed order; every thread gets the result.
template <typename A>
__device__ MaxSum<A> block_merge(MaxSum<A> v) {
  __shared__ A sm[kWarps], ss[kWarps];
  __shared__ MaxSum<A> result;
  for (int off = 16; off > 0; off >>= 1) {
    MaxSum<A> o{__shfl_xor_sync(0xffffffffu, v.m, off), __shfl_xor_sync(0xffffffffu, v.s, off)};
    v = merge(v, o);
  }
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sm[warp] = v.m;
    ss[warp] = v.s;
  }
  __syncthreads();
  if (warp == 0) {
    MaxSum<A> w{-std::numeric_limits<A>::infinity(), A(0)};
    if (lane < kWarps) w = {sm[lane], ss[lane]};
    for (int off = 16; off > 0; off >>= 1) {
      MaxSum<A> o{__shfl_xor_sync(0xffffffffu, w.m, off), __shfl_xor_sync(0xffffffffu, w.s, off)};
      w = merge(w, o);
    }
    if (lane == 0) result = w;
  }
  __syncthreads();
  return result;
}

// The online max/sum of row[0, n), merged over the block; every thread gets it. Every thread of
// the block must call it (it contains barriers).
template <typename T>
__device__ MaxSum<acc_t<T>> row_max_sum(const T* row, int64_t n) {
  using A = acc_t<T>;
  MaxSum<A> acc{-std::numeric_limits<A>::infinity(), A(0)};
  const int64_t head = head_elements(row, n);
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) add(acc, convert<A>(row[j]));
  const int64_t nvec = (n - head) / kVec<T>;
  const uint4* packs = reinterpret_cast<const uint4*>(row + head);
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
    const uint4 p = packs[v];
    A x[kVec<T>];
    A pm = get<T>(p, 0);
#pragma unroll
    for (int e = 0; e < kVec<T>; ++e) {
      x[e] = get<T>(p, e);
      pm = x[e] > pm ? x[e] : pm;
    }
    if (pm > acc.m) {  // rescale once per pack, then add its terms
      acc.s *= exp_acc(acc.m - pm);
      acc.m = pm;
    }
    // -inf terms add nothing (and would give NaN against acc.m = -inf); a NaN anywhere in the
    // pack — even as pm, which then skipped the rescale — reaches acc.s, as on the CPU.
#pragma unroll
    for (int e = 0; e < kVec<T>; ++e) {
      if (x[e] != -std::numeric_limits<A>::infinity()) acc.s += exp_acc(x[e] - acc.m);
    }
  }
  for (int64_t j = head + nvec * kVec<T> + threadIdx.x; j < n; j += blockDim.x) {
    add(acc, convert<A>(row[j]));
  }
  return block_merge(acc);
}

template <typename A>
__device__ __forceinline__ A lse_of(MaxSum<A> total) {
  return isinf(total.m) ? total.m : total.m + log_acc(total.s);
}

// logits (N, Vp), targets (N) → loss (N), lse (N). Grid: one block of kThreads per row.
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_forward_kernel(const T* logits, const I* targets, int64_t vp, int64_t vocab,
                                 int64_t ignore_index, acc_t<T>* loss, acc_t<T>* lse) {
  using A = acc_t<T>;
  const int64_t r = blockIdx.x;
  const int64_t t = static_cast<int64_t>(targets[r]);
  if (t == ignore_index) {  // uniform over the block: no thread reaches a barrier
    if (threadIdx.x == 0) loss[r] = lse[r] = A(0);
    return;
  }
  const T* row = logits + r * vp;
  const MaxSum<A> total = row_max_sum(row, vocab);
  if (threadIdx.x == 0) {
    if (t < 0 || t >= vocab) {
      loss[r] = lse[r] = std::numeric_limits<A>::quiet_NaN();
      return;
    }
    // The max and the sum in A; lse and loss formed in double (a confident row's loss is a small
    // difference of two large numbers).
    const double l = isinf(total.m)
                         ? static_cast<double>(total.m)
                         : static_cast<double>(total.m) + log(static_cast<double>(total.s));
    lse[r] = static_cast<A>(l);
    loss[r] = static_cast<A>(l - static_cast<double>(convert<A>(row[t])));
  }
}

// Note [Vocab-parallel cross-entropy kernels]: lse over this rank's first `valid` columns, and
// the target's logit where this rank holds it. Targets are global ids: only a negative one
// (not ignore_index) is detectably wrong here; it gets NaN (the CPU kernel throws).
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    vocab_parallel_ce_forward_kernel(const T* logits, const I* targets, int64_t vp, int64_t valid,
                                     int64_t vocab_start, int64_t ignore_index, acc_t<T>* lse_local,
                                     acc_t<T>* target_logit) {
  using A = acc_t<T>;
  const int64_t r = blockIdx.x;
  const int64_t t = static_cast<int64_t>(targets[r]);
  if (t == ignore_index) {  // uniform over the block
    if (threadIdx.x == 0) lse_local[r] = target_logit[r] = A(0);
    return;
  }
  const T* row = logits + r * vp;
  const MaxSum<A> total = row_max_sum(row, valid);
  if (threadIdx.x == 0) {
    if (t < 0) {
      lse_local[r] = target_logit[r] = std::numeric_limits<A>::quiet_NaN();
      return;
    }
    lse_local[r] = lse_of(total);
    const int64_t j = t - vocab_start;
    target_logit[r] = j >= 0 && j < valid ? convert<A>(row[j]) : A(0);
  }
}

// drow[j] += (exp(row[j] − l) − [j == t]) · g for j < n; t may lie outside [0, n) (no one-hot
// term then). The block's threads share the row.
template <typename T>
__device__ void add_row_grad(const T* row, T* drow, int64_t n, int64_t t, acc_t<T> l, acc_t<T> g) {
  using A = acc_t<T>;
  auto grad = [&](int64_t j, A x, A d) { return d + exp_acc(x - l) * g - (j == t ? g : A(0)); };
  // Vectorise only when both rows share their alignment within 16 bytes.
  const bool same_phase =
      reinterpret_cast<uintptr_t>(row) % 16 == reinterpret_cast<uintptr_t>(drow) % 16;
  const int64_t head = same_phase ? head_elements(row, n) : n;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) {
    drow[j] = convert<T>(grad(j, convert<A>(row[j]), convert<A>(drow[j])));
  }
  const int64_t nvec = (n - head) / kVec<T>;
  const uint4* xp = reinterpret_cast<const uint4*>(row + head);
  uint4* dp = reinterpret_cast<uint4*>(drow + head);
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
    const uint4 x = xp[v];
    uint4 d = dp[v];
    const int64_t j0 = head + v * kVec<T>;
#pragma unroll
    for (int e = 0; e < kVec<T>; ++e) set<T>(d, e, grad(j0 + e, get<T>(x, e), get<T>(d, e)));
    dp[v] = d;
  }
  for (int64_t j = head + nvec * kVec<T> + threadIdx.x; j < n; j += blockDim.x) {
    drow[j] = convert<T>(grad(j, convert<A>(row[j]), convert<A>(drow[j])));
  }
}

// A row whose target cannot be right gets NaN gradients over its first n columns.
template <typename T>
__device__ void poison_row(T* drow, int64_t n) {
  using A = acc_t<T>;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    drow[j] = convert<T>(std::numeric_limits<A>::quiet_NaN());
  }
}

// dlogits (N, Vp) += (exp(logits − lse) − onehot(t)) · dloss · grad_scale over j < vocab.
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(const T* logits, const I* targets, const acc_t<T>* lse,
                                  const acc_t<T>* dloss, acc_t<T> grad_scale, int64_t vp,
                                  int64_t vocab, int64_t ignore_index, T* dlogits) {
  const int64_t r = blockIdx.x;
  const int64_t t = static_cast<int64_t>(targets[r]);
  if (t == ignore_index) return;
  if (t < 0 || t >= vocab) return poison_row(dlogits + r * vp, vocab);
  add_row_grad(logits + r * vp, dlogits + r * vp, vocab, t, lse[r], dloss[0] * grad_scale);
}

// The same over this rank's first `valid` columns, the one-hot at the global target's local
// column when this rank holds it (Note [Vocab-parallel cross-entropy kernels]).
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    vocab_parallel_ce_backward_kernel(const T* logits, const I* targets, const acc_t<T>* lse,
                                      const acc_t<T>* dloss, acc_t<T> grad_scale, int64_t vp,
                                      int64_t valid, int64_t vocab_start, int64_t ignore_index,
                                      T* dlogits) {
  const int64_t r = blockIdx.x;
  const int64_t t = static_cast<int64_t>(targets[r]);
  if (t == ignore_index) return;
  if (t < 0) return poison_row(dlogits + r * vp, valid);
  add_row_grad(logits + r * vp, dlogits + r * vp, valid, t - vocab_start, lse[r],
               dloss[0] * grad_scale);
}

// Note [Vocab-parallel lse combine]: one thread per row, in double, ranks in order (the CPU's
// arithmetic; exp and log may differ from glibc's in the last bit).
constexpr unsigned kRowThreads = 256;  // the rows kernel's block (its __launch_bounds__)

template <typename S, typename I>
__global__ void __launch_bounds__(kRowThreads)
    lse_combine_rows_kernel(const S* lses, const S* target_logit, const I* targets, int64_t g,
                            int64_t n, int64_t ignore_index, int64_t vocab, S* lse,
                            double* row_loss) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < n; r += step) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    if (t == ignore_index) {
      lse[r] = S(0);
      row_loss[r] = 0.0;
      continue;
    }
    if (t < 0 || t >= vocab) {
      lse[r] = static_cast<S>(std::numeric_limits<double>::quiet_NaN());
      row_loss[r] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t q = 0; q < g; ++q) {
      const auto x = static_cast<double>(lses[q * n + r]);
      m = m < x ? x : m;
    }
    double sum = 0.0;
    for (int64_t q = 0; q < g; ++q) sum += ::exp(static_cast<double>(lses[q * n + r]) - m);
    const double l = m + ::log(sum);
    lse[r] = static_cast<S>(l);
    row_loss[r] = l - static_cast<double>(target_logit[r]);
  }
}

// One block: Σ row_loss and the count over non-ignored rows, in a fixed order (each thread its
// strided rows, then block_sum), then loss = Σ / count and inv_count = 1 / count (0 and 0 when
// no row counts).
constexpr unsigned kMeanThreads = 512;

template <typename S, typename I>
__global__ void __launch_bounds__(kMeanThreads)
    lse_combine_mean_kernel(const double* row_loss, const I* targets, int64_t n,
                            int64_t ignore_index, S* loss, double* inv_count) {
  __shared__ double scratch[2 * kWarpSize];
  double v[2] = {0.0, 0.0};
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
    if (static_cast<int64_t>(targets[r]) == ignore_index) continue;
    v[0] += row_loss[r];
    v[1] += 1.0;
  }
  block_sum<2>(v, scratch);
  if (threadIdx.x == 0) {
    loss[0] = static_cast<S>(v[1] > 0.0 ? v[0] / v[1] : 0.0);
    inv_count[0] = v[1] > 0.0 ? 1.0 / v[1] : 0.0;
  }
}

// ---- launchers ----

DType row_dtype(DType logits) { return logits == DType::kF64 ? DType::kF64 : DType::kF32; }

// Binds T to the logits' storage type (f32, f64, bf16, f16).
template <typename F>
void dispatch_logits(DType dt, const char* name, F&& f) {
  switch (dt) {
    case DType::kF32:
      return f(float{});
    case DType::kF64:
      return f(double{});
    case DType::kBF16:
      return f(BFloat16{});
    case DType::kF16:
      return f(Float16{});
    default:
      LOOM_FAIL(name, ": dtype ", dtype_name(dt), " not supported (f32, f64, bf16, f16)");
  }
}

// One block per row of logits (N, Vp): returns at N = 0, and otherwise calls
// launch(T{}, I{}, grid) with T the logits' storage type and I the targets' index type, then
// checks the launch. The four cross-entropy launches below differ only in their kernel.
template <typename F>
void launch_per_row(const Tensor& logits, const Tensor& targets, const char* name, F&& launch) {
  const int64_t n = logits.size(0);
  if (n == 0) return;
  LOOM_CHECK(n <= std::numeric_limits<int32_t>::max(), name, ": too many rows (", n, ")");
  CudaDeviceGuard guard(logits.device().index);
  dispatch_logits(logits.dtype(), name, [&](auto tag) {
    LOOM_DISPATCH_INDEX(targets.dtype(), name,
                        [&] { launch(tag, index_t{}, static_cast<unsigned>(n)); });
  });
  LOOM_CUDA_LAUNCH_CHECK();
}

void cross_entropy_forward_cuda(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                int64_t vocab_size, Tensor& loss, Tensor& lse) {
  const char* name = "cross_entropy_forward";
  check_logits_targets(logits, targets, vocab_size, name);
  check_row_buffer(loss, logits.size(0), row_dtype(logits.dtype()), name, "loss");
  check_row_buffer(lse, logits.size(0), row_dtype(logits.dtype()), name, "lse");
  launch_per_row(logits, targets, name, [&](auto tag, auto itag, unsigned grid) {
    using T = decltype(tag);
    using A = acc_t<T>;
    using index_t = decltype(itag);
    cross_entropy_forward_kernel<T, index_t><<<grid, kThreads, 0, compute_stream()>>>(
        static_cast<const T*>(logits.raw_data()), static_cast<const index_t*>(targets.raw_data()),
        logits.size(1), vocab_size, ignore_index, static_cast<A*>(loss.raw_data()),
        static_cast<A*>(lse.raw_data()));
  });
}

void cross_entropy_backward_cuda(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 const Tensor& dloss, double grad_scale, int64_t ignore_index,
                                 int64_t vocab_size, Tensor& dlogits) {
  const char* name = "cross_entropy_backward";
  check_logits_targets(logits, targets, vocab_size, name);
  check_row_buffer(lse, logits.size(0), row_dtype(logits.dtype()), name, "lse");
  check_backward_args(logits, lse, dloss, dlogits, name);
  launch_per_row(logits, targets, name, [&](auto tag, auto itag, unsigned grid) {
    using T = decltype(tag);
    using A = acc_t<T>;
    using index_t = decltype(itag);
    cross_entropy_backward_kernel<T, index_t><<<grid, kThreads, 0, compute_stream()>>>(
        static_cast<const T*>(logits.raw_data()), static_cast<const index_t*>(targets.raw_data()),
        static_cast<const A*>(lse.raw_data()), static_cast<const A*>(dloss.raw_data()),
        static_cast<A>(grad_scale), logits.size(1), vocab_size, ignore_index,
        static_cast<T*>(dlogits.raw_data()));
  });
}

void vocab_parallel_ce_forward_cuda(const Tensor& logits, const Tensor& targets,
                                    int64_t ignore_index, int64_t vocab_start, int64_t vocab_valid,
                                    Tensor& lse_local, Tensor& target_logit) {
  const char* name = "vocab_parallel_ce_forward";
  check_logits_targets(logits, targets, vocab_valid, name);
  check_shard(logits, vocab_start, vocab_valid, name);
  check_row_buffer(lse_local, logits.size(0), row_dtype(logits.dtype()), name, "lse_local");
  check_row_buffer(target_logit, logits.size(0), row_dtype(logits.dtype()), name, "target_logit");
  launch_per_row(logits, targets, name, [&](auto tag, auto itag, unsigned grid) {
    using T = decltype(tag);
    using A = acc_t<T>;
    using index_t = decltype(itag);
    vocab_parallel_ce_forward_kernel<T, index_t><<<grid, kThreads, 0, compute_stream()>>>(
        static_cast<const T*>(logits.raw_data()), static_cast<const index_t*>(targets.raw_data()),
        logits.size(1), vocab_valid, vocab_start, ignore_index,
        static_cast<A*>(lse_local.raw_data()), static_cast<A*>(target_logit.raw_data()));
  });
}

void vocab_parallel_ce_backward_cuda(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                     const Tensor& dloss, double grad_scale, int64_t ignore_index,
                                     int64_t vocab_start, int64_t vocab_valid, Tensor& dlogits) {
  const char* name = "vocab_parallel_ce_backward";
  check_logits_targets(logits, targets, vocab_valid, name);
  check_shard(logits, vocab_start, vocab_valid, name);
  check_row_buffer(lse, logits.size(0), row_dtype(logits.dtype()), name, "lse");
  check_backward_args(logits, lse, dloss, dlogits, name);
  launch_per_row(logits, targets, name, [&](auto tag, auto itag, unsigned grid) {
    using T = decltype(tag);
    using A = acc_t<T>;
    using index_t = decltype(itag);
    vocab_parallel_ce_backward_kernel<T, index_t><<<grid, kThreads, 0, compute_stream()>>>(
        static_cast<const T*>(logits.raw_data()), static_cast<const index_t*>(targets.raw_data()),
        static_cast<const A*>(lse.raw_data()), static_cast<const A*>(dloss.raw_data()),
        static_cast<A>(grad_scale), logits.size(1), vocab_valid, vocab_start, ignore_index,
        static_cast<T*>(dlogits.raw_data()));
  });
}

void vocab_parallel_lse_combine_cuda(const Tensor& lses, const Tensor& target_logit,
                                     const Tensor& targets, int64_t ignore_index,
                                     int64_t vocab_size, Tensor& lse, Tensor& row_loss,
                                     Tensor& loss, Tensor& inv_count) {
  const char* name = "vocab_parallel_lse_combine";
  check_lse_combine_args(lses, target_logit, targets, vocab_size, lse, row_loss, loss, inv_count,
                         name);
  const int64_t g = lses.size(0), n = lses.size(1);
  const DType dt = lses.dtype();
  LOOM_CHECK(dt == DType::kF32 || dt == DType::kF64, name, ": lses dtype ", dtype_name(dt),
             " not supported (f32, f64)");
  CudaDeviceGuard guard(lses.device().index);
  auto launch = [&](auto tag) {
    using S = decltype(tag);
    LOOM_DISPATCH_INDEX(targets.dtype(), name, [&] {
      const auto* pt = static_cast<const index_t*>(targets.raw_data());
      if (n > 0) {
        lse_combine_rows_kernel<S, index_t>
            <<<grid_for(n, kRowThreads), kRowThreads, 0, compute_stream()>>>(
                static_cast<const S*>(lses.raw_data()),
                static_cast<const S*>(target_logit.raw_data()), pt, g, n, ignore_index, vocab_size,
                static_cast<S*>(lse.raw_data()), static_cast<double*>(row_loss.raw_data()));
        LOOM_CUDA_LAUNCH_CHECK();
      }
      lse_combine_mean_kernel<S, index_t><<<1, kMeanThreads, 0, compute_stream()>>>(
          static_cast<const double*>(row_loss.raw_data()), pt, n, ignore_index,
          static_cast<S*>(loss.raw_data()), static_cast<double*>(inv_count.raw_data()));
      LOOM_CUDA_LAUNCH_CHECK();
    });
  };
  if (dt == DType::kF64) {
    launch(double{});
  } else {
    launch(float{});
  }
}

}  // namespace

LOOM_REGISTER_KERNEL(vocab_parallel_ce_forward, kCuda, vocab_parallel_ce_forward_cuda);
LOOM_REGISTER_KERNEL(vocab_parallel_ce_backward, kCuda, vocab_parallel_ce_backward_cuda);
LOOM_REGISTER_KERNEL(vocab_parallel_lse_combine, kCuda, vocab_parallel_lse_combine_cuda);
LOOM_REGISTER_KERNEL(cross_entropy_forward, kCuda, cross_entropy_forward_cuda);
LOOM_REGISTER_KERNEL(cross_entropy_backward, kCuda, cross_entropy_backward_cuda);

}  // namespace loom::kernels::cuda
