// kernels/cuda/embedding.cu — CUDA embedding gather (forward) and deterministic scatter-add
// (backward), the contracts of kernels/embedding.h, for f32/f64 and bf16/f16 storage; and the
// shard-local ids and mask of a vocab-parallel lookup (vocab_parallel_ids, no host sync).
//
// Note [CUDA embedding backward]: token positions are grouped by id with a stable radix sort of
// (id, position) pairs (CUB), so each id's positions stay in token order. The block of a run's
// first entry sums that run's dout rows in token order, in double, and adds the sum to its
// weight row once: no float atomics, the same order and precision as the CPU kernel (f32 results
// are the CPU's bits). Work is proportional to N·C, whatever V.
//
// Both kernels validate ids on the device (an integer atomicMin keeps the first bad position)
// and read that flag back, synchronising the compute stream once per call: the one host sync
// here, needed to raise the CPU kernel's error (id, position, V) at the call that sees it. With
// ids_checked (the caller checked them: ops::embedding does on the host before uploading host
// ids, and its backward passes it for ids its forward checked) neither check nor sync runs; an
// id outside [0, V) is then skipped by the gather and summed into row 0 by the backward.
#include <climits>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/vec_map.cuh"
#include "kernels/embedding.h"

namespace loom::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;  // every kernel's block (their __launch_bounds__)
constexpr unsigned long long kNoBadId = ULLONG_MAX;

template <typename I>
__device__ __forceinline__ bool id_ok(I id, int64_t vocab) {
  const int64_t v = static_cast<int64_t>(id);
  return v >= 0 && v < vocab;
}

// Records the first position whose id is outside [0, vocab) (unless bad is null); with keys/pos
// set, also writes the sort input (id, position) pairs.
template <typename I>
__global__ void __launch_bounds__(kThreads)
    check_ids_kernel(const I* ids, int64_t n, int64_t vocab, unsigned long long* bad,
                     uint32_t* keys, uint32_t* pos) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const I id = ids[i];
    const bool ok = id_ok(id, vocab);
    if (!ok && bad != nullptr) atomicMin(bad, static_cast<unsigned long long>(i));
    if (keys != nullptr) {
      keys[i] = ok ? static_cast<uint32_t>(id) : 0u;
      pos[i] = static_cast<uint32_t>(i);
    }
  }
}

// out[t, :] = weight[ids[t], :], in packs of V elements (V > 1 needs cols % V == 0, aligned rows).
template <typename T, typename I, int V>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(const I* ids, const T* weight, T* out, int64_t n, int64_t vocab, int64_t cols) {
  using P = Pack<T, V>;
  const int64_t per_row = cols / V;
  const int64_t total = n * per_row;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += step) {
    const int64_t t = k / per_row, c = (k % per_row) * V;
    const I id = ids[t];
    if (!id_ok(id, vocab)) continue;  // reported by check_ids_kernel
    const int64_t src = static_cast<int64_t>(id) * cols + c;
    *reinterpret_cast<P*>(out + t * cols + c) = *reinterpret_cast<const P*>(weight + src);
  }
}

// Note [CUDA embedding backward]: the block of each run's first sorted entry sums the run.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    accumulate_runs_kernel(const uint32_t* keys, const uint32_t* pos, int64_t n, const T* dout,
                           T* dweight, int64_t cols) {
  using C = compute_t<T>;
  for (int64_t j = blockIdx.x; j < n; j += gridDim.x) {
    const uint32_t key = keys[j];
    if (j > 0 && keys[j - 1] == key) continue;  // not the head of its run
    int64_t end = j + 1;
    while (end < n && keys[end] == key) ++end;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      double acc = 0.0;
      for (int64_t r = j; r < end; ++r) {
        acc += static_cast<double>(convert<C>(dout[static_cast<int64_t>(pos[r]) * cols + c]));
      }
      T* dst = dweight + static_cast<int64_t>(key) * cols + c;
      *dst = convert<T>(add_rn(convert<C>(*dst), static_cast<C>(acc)));
    }
  }
}

unsigned blocks_for(int64_t tasks, unsigned threads) { return grid_for(tasks, threads); }

// Raises the CPU kernel's error if check_ids_kernel flagged a position (synchronises).
template <typename I>
void throw_if_bad(const I* ids, const unsigned long long* bad_dev, int64_t vocab) {
  unsigned long long bad = kNoBadId;
  CUDA_CHECK(cudaMemcpyAsync(&bad, bad_dev, sizeof bad, cudaMemcpyDeviceToHost, compute_stream()));
  CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
  if (bad == kNoBadId) return;
  I id{};
  CUDA_CHECK(cudaMemcpy(&id, ids + bad, sizeof id, cudaMemcpyDeviceToHost));
  LOOM_FAIL("embedding: id ", static_cast<int64_t>(id), " at position ", bad,
            " is out of range for a vocabulary of V=", vocab);
}

// A device flag set to kNoBadId (an i64 tensor of one element that keeps it alive).
Tensor make_flag(const Device& dev) {
  Tensor flag = Tensor::empty({1}, DType::kI64, dev);
  CUDA_CHECK(cudaMemsetAsync(flag.raw_data(), 0xff, sizeof(unsigned long long), compute_stream()));
  return flag;
}

void check_embedding_args(const char* op, const Tensor& ids, const Tensor& table,
                          const Tensor& rows) {
  LOOM_CHECK(table.dim() == 2, op, ": weight must be (V, C), got ", shape_str(table.shape()));
  LOOM_CHECK(rows.numel() == ids.numel() * table.size(1), op, ": ", shape_str(rows.shape()),
             " does not hold ", ids.numel(), " rows of ", table.size(1));
  LOOM_CHECK(rows.dtype() == table.dtype(), op, ": dtypes ", dtype_name(rows.dtype()), " and ",
             dtype_name(table.dtype()), " differ");
  LOOM_CHECK(ids.is_contiguous() && table.is_contiguous() && rows.is_contiguous(), op,
             ": cuda kernel needs contiguous tensors");
}

void embedding_forward_cuda(const Tensor& ids, const Tensor& weight, Tensor& out,
                            bool ids_checked) {
  check_embedding_args("embedding_forward", ids, weight, out);
  const int64_t n = ids.numel(), vocab = weight.size(0), cols = weight.size(1);
  if (n == 0) return;
  CudaDeviceGuard guard(out.device().index);
  LOOM_CUDA_DISPATCH_FLOAT(weight.dtype(), "embedding_forward", [&] {
    using T = scalar_t;
    LOOM_DISPATCH_INDEX(ids.dtype(), "embedding_forward", [&] {
      const index_t* pi = static_cast<const index_t*>(ids.raw_data());
      if (!ids_checked) {
        Tensor flag = make_flag(out.device());
        auto* bad = static_cast<unsigned long long*>(flag.raw_data());
        check_ids_kernel<index_t><<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(
            pi, n, vocab, bad, nullptr, nullptr);
        LOOM_CUDA_LAUNCH_CHECK();
        throw_if_bad(pi, bad, vocab);
      }
      if (cols == 0) return;
      const T* pw = static_cast<const T*>(weight.raw_data());
      T* po = static_cast<T*>(out.raw_data());
      constexpr int V = kPackOf<T>;
      const bool vec = cols % V == 0 && reinterpret_cast<uintptr_t>(pw) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(po) % 16 == 0;
      if (vec) {
        gather_kernel<T, index_t, V>
            <<<blocks_for(n * (cols / V), kThreads), kThreads, 0, compute_stream()>>>(pi, pw, po, n,
                                                                                      vocab, cols);
      } else {
        gather_kernel<T, index_t, 1>
            <<<blocks_for(n * cols, kThreads), kThreads, 0, compute_stream()>>>(pi, pw, po, n,
                                                                                vocab, cols);
      }
      LOOM_CUDA_LAUNCH_CHECK();
    });
  });
}

// Bits needed for keys in [0, vocab).
int key_bits(int64_t vocab) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

void embedding_backward_cuda(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                             bool ids_checked) {
  check_embedding_args("embedding_backward", ids, dweight, dout);
  const int64_t n = ids.numel(), vocab = dweight.size(0), cols = dweight.size(1);
  if (n == 0) return;
  LOOM_CHECK(n <= int64_t{UINT32_MAX} && vocab <= int64_t{UINT32_MAX},
             "embedding_backward: cuda kernel handles at most 2^32-1 tokens and ids");
  const Device dev = dweight.device();
  CudaDeviceGuard guard(dev.index);
  Tensor keys_in = Tensor::empty({n}, DType::kU32, dev),
         keys = Tensor::empty({n}, DType::kU32, dev);
  Tensor pos_in = Tensor::empty({n}, DType::kU32, dev), pos = Tensor::empty({n}, DType::kU32, dev);
  LOOM_DISPATCH_INDEX(ids.dtype(), "embedding_backward", [&] {
    const index_t* pi = static_cast<const index_t*>(ids.raw_data());
    Tensor flag = ids_checked ? Tensor() : make_flag(dev);
    auto* bad = ids_checked ? nullptr : static_cast<unsigned long long*>(flag.raw_data());
    check_ids_kernel<index_t><<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(
        pi, n, vocab, bad, keys_in.data<uint32_t>(), pos_in.data<uint32_t>());
    LOOM_CUDA_LAUNCH_CHECK();
    if (!ids_checked) throw_if_bad(pi, bad, vocab);
  });
  if (cols == 0) return;
  const int end_bit = key_bits(vocab);
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, keys_in.data<uint32_t>(), keys.data<uint32_t>(), pos_in.data<uint32_t>(),
      pos.data<uint32_t>(), n, 0, end_bit, compute_stream()));
  const int64_t temp_words = static_cast<int64_t>((temp_bytes + 7) / 8);
  Tensor temp = Tensor::empty({temp_words > 0 ? temp_words : 1}, DType::kI64, dev);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      temp.raw_data(), temp_bytes, keys_in.data<uint32_t>(), keys.data<uint32_t>(),
      pos_in.data<uint32_t>(), pos.data<uint32_t>(), n, 0, end_bit, compute_stream()));
  LOOM_CUDA_LAUNCH_CHECK();
  LOOM_CUDA_DISPATCH_FLOAT(dweight.dtype(), "embedding_backward", [&] {
    using T = scalar_t;
    accumulate_runs_kernel<T><<<blocks_for(n, 1), kThreads, 0, compute_stream()>>>(
        keys.data<uint32_t>(), pos.data<uint32_t>(), n, static_cast<const T*>(dout.raw_data()),
        static_cast<T*>(dweight.raw_data()), cols);
    LOOM_CUDA_LAUNCH_CHECK();
  });
}

// kernels/embedding.h vocab_parallel_ids: one thread per id (grid-stride), no checks needed
// (ids outside the shard are masked, never read).
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    vocab_parallel_ids_kernel(const I* ids, int64_t n, int64_t start, int64_t rows,
                              int64_t* local_ids, T* mask) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const auto id = static_cast<int64_t>(ids[i]);
    const bool mine = id >= start && id < start + rows;
    local_ids[i] = mine ? id - start : 0;
    mask[i] = convert<T>(mine ? 1.0f : 0.0f);
  }
}

void vocab_parallel_ids_cuda(const Tensor& ids, int64_t vocab_start, int64_t rows,
                             Tensor& local_ids, Tensor& mask) {
  const char* name = "vocab_parallel_ids";
  const int64_t n = ids.numel();
  check_vocab_parallel_ids_args(ids, local_ids, mask);
  if (n == 0) return;
  CudaDeviceGuard guard(ids.device().index);
  LOOM_CUDA_DISPATCH_FLOAT(mask.dtype(), name, [&] {
    using T = scalar_t;
    LOOM_DISPATCH_INDEX(ids.dtype(), name, [&] {
      vocab_parallel_ids_kernel<T, index_t>
          <<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(
              static_cast<const index_t*>(ids.raw_data()), n, vocab_start, rows,
              static_cast<int64_t*>(local_ids.raw_data()), static_cast<T*>(mask.raw_data()));
    });
  });
  LOOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

LOOM_REGISTER_KERNEL(vocab_parallel_ids, kCuda, vocab_parallel_ids_cuda);
LOOM_REGISTER_KERNEL(embedding_forward, kCuda, embedding_forward_cuda);
LOOM_REGISTER_KERNEL(embedding_backward, kCuda, embedding_backward_cuda);

}  // namespace loom::kernels::cuda
