// kernels/cuda/copy.cu — CUDA data movement: host↔device transfers, device_count and
// device_name, fill and the strided, dtype-converting device copy. Device-side work runs on
// the compute stream (kernels/cuda/cuda_device.cuh). Uploads up to kMaxStagedBytes go through
// pinned staging blocks and return without waiting (Note [Asynchronous uploads]); larger
// uploads and every download are blocking cudaMemcpy calls, which order themselves after all
// earlier work. Conversions give the CPU kernels' bits (kernels/cuda/dtype_convert.cuh). Must
// not synchronise the host except in the blocking transfers.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "kernels/copy.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/dtype_convert.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kMaxDims = 8;
constexpr unsigned kThreads = 256;  // the kernels' block (their __launch_bounds__)

// A strided walk over up to kMaxDims dims, passed to kernels by value. Dims are coalesced
// first, so only layouts with more than kMaxDims truly separate dims are refused.
struct StridedGeometry {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t src_stride[kMaxDims] = {};
  int64_t dst_stride[kMaxDims] = {};
};

// Drops size-1 dims and merges neighbours that are contiguous with each other in both tensors.
// `src_strides` may be null (fill: one tensor).
StridedGeometry make_geometry(const Shape& shape, const Shape* src_strides,
                              const Shape& dst_strides, const char* op) {
  struct Dim {
    int64_t size, ss, ds;
  };
  std::vector<Dim> dims;  // innermost first
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    const int64_t ss = src_strides ? (*src_strides)[i] : 0, ds = dst_strides[i];
    if (shape[i] == 1) continue;
    if (!dims.empty() && ss == dims.back().ss * dims.back().size &&
        ds == dims.back().ds * dims.back().size) {
      dims.back().size *= shape[i];
    } else {
      dims.push_back({shape[i], ss, ds});
    }
  }
  LOOM_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), op, ": cuda kernel handles at most ",
             kMaxDims, " non-mergeable dims, got ", dims.size(), " for shape ", shape_str(shape));
  StridedGeometry g;
  g.ndim = static_cast<int>(dims.size());
  for (int d = 0; d < g.ndim; ++d) {
    const Dim& dim = dims[static_cast<size_t>(g.ndim - 1 - d)];
    g.shape[d] = dim.size;
    g.src_stride[d] = dim.ss;
    g.dst_stride[d] = dim.ds;
  }
  return g;
}

// Element offsets of logical index i in the source and destination.
__device__ __forceinline__ void strided_offsets(int64_t i, const StridedGeometry& g, int64_t& os,
                                                int64_t& od) {
  os = 0;
  od = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d >= g.ndim) continue;
    const int64_t idx = i % g.shape[d];
    i /= g.shape[d];
    os += idx * g.src_stride[d];
    od += idx * g.dst_stride[d];
  }
}

template <typename S, typename D>
__global__ void __launch_bounds__(kThreads)
    copy_kernel(const S* src, D* dst, int64_t n, StridedGeometry g) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t os, od;
    strided_offsets(i, g, os, od);
    dst[od] = convert<D>(src[os]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    fill_kernel(T* dst, int64_t n, T value, StridedGeometry g) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const bool dense = g.ndim == 1 && g.dst_stride[0] == 1;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t os, od = i;
    if (!dense) strided_offsets(i, g, os, od);
    dst[od] = value;
  }
}

// The CPU's convert<T>(double): 16-bit floats round through f32 (core/dtype.h constructors).
template <typename T>
T host_value(double v) {
  if constexpr (kIsHalf<T>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

void copy_cuda(const Tensor& src, Tensor& dst) {
  LOOM_CHECK(src.shape() == dst.shape(), "copy: shapes ", shape_str(src.shape()), " and ",
             shape_str(dst.shape()), " differ");
  const int64_t n = dst.numel();
  if (n == 0) return;
  CudaDeviceGuard guard(dst.device().index);
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(),
                               cudaMemcpyDeviceToDevice, compute_stream()));
    return;
  }
  const StridedGeometry g = make_geometry(dst.shape(), &src.strides(), dst.strides(), "copy");
  LOOM_DISPATCH_ALL(src.dtype(), "copy", [&] {
    using src_t = scalar_t;
    const src_t* s = static_cast<const src_t*>(src.raw_data());
    LOOM_DISPATCH_ALL(dst.dtype(), "copy", [&] {
      scalar_t* d = static_cast<scalar_t*>(dst.raw_data());
      copy_kernel<src_t, scalar_t>
          <<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(s, d, n, g);
    });
  });
  LOOM_CUDA_LAUNCH_CHECK();
}

void fill_cuda(Tensor& dst, double value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  CudaDeviceGuard guard(dst.device().index);
  const StridedGeometry g = make_geometry(dst.shape(), nullptr, dst.strides(), "fill");
  LOOM_DISPATCH_ALL(dst.dtype(), "fill", [&] {
    scalar_t* d = static_cast<scalar_t*>(dst.raw_data());
    fill_kernel<scalar_t><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
        d, n, host_value<scalar_t>(value), g);
  });
  LOOM_CUDA_LAUNCH_CHECK();
}

void check_transfer(const Tensor& src, const Tensor& dst, const char* op) {
  LOOM_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(), op, ": ",
             shape_str(src.shape()), " ", dtype_name(src.dtype()), " → ", shape_str(dst.shape()),
             " ", dtype_name(dst.dtype()), " (shape and dtype must match)");
  LOOM_CHECK(src.is_contiguous() && dst.is_contiguous(), op, ": tensors must be contiguous");
}

// Note [Asynchronous uploads]: a host→device copy of at most kMaxStagedBytes is copied by the
// host into a pinned staging block, then from the block into the tensor by cudaMemcpyAsync on
// the calling thread's compute stream, with an event recorded behind it; the call returns
// without waiting for the device. (A cudaMemcpy from pageable memory first waits for the legacy
// stream, i.e. for all work issued before it: uploading a batch would drain the queue of the
// previous step's work, Note [Device step] in train/train_step.cpp.) Work issued afterwards on the
// compute stream sees the data; communication is ordered against the compute stream by events
// and the staged MPI transfers run on the legacy stream, so both see it too. A block is reused
// once its event has completed. Blocks are kept per device in a process-wide cache, like the
// caching allocator's memory (never freed: statics may be destroyed after the runtime); at most
// kMaxStagingBlocks exist, and when none is free and no more may be made the upload falls back
// to the blocking copy. Blocks are made as uploads need them, in the first steps, and reused
// after: cudaMallocHost is no part of the steady state.
class StagingBlocks {
 public:
  static constexpr size_t kMaxStagedBytes = size_t{16} << 20;
  static constexpr size_t kMinBlockBytes = size_t{64} << 10;
  // Enough for every upload of a step launched while the device finishes the previous one (a
  // micro-batch uploads its ids, targets and positions) at any gradient accumulation in use.
  static constexpr size_t kMaxStagingBlocks = 1024;

  static StagingBlocks& instance() {
    static StagingBlocks* blocks = new StagingBlocks();  // see the Note: never destroyed
    return *blocks;
  }

  // Starts dst ← src (bytes ≤ kMaxStagedBytes) on the current device's compute stream; false
  // when no block could take it (the caller copies synchronously instead).
  bool upload(void* dst, const void* src, size_t bytes, int device) {
    std::lock_guard<std::mutex> lock(mu_);
    // Blocks whose copies are done, oldest first; the first one still in flight stops the scan
    // (later ones usually are too: one stream completes in order).
    while (!in_flight_.empty()) {
      const cudaError_t state = cudaEventQuery(in_flight_.front().done);
      if (state == cudaErrorNotReady) break;
      CUDA_CHECK(state);
      free_.push_back(in_flight_.front());
      in_flight_.pop_front();
    }
    auto best = free_.end();  // the smallest free block of this device that fits
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      const bool fits = it->device == device && it->bytes >= bytes;
      if (fits && (best == free_.end() || it->bytes < best->bytes)) best = it;
    }
    Block b;
    if (best != free_.end()) {
      b = *best;
      free_.erase(best);
    } else {
      if (free_.size() + in_flight_.size() >= kMaxStagingBlocks) return false;
      b.device = device;
      b.bytes = std::max(kMinBlockBytes, std::bit_ceil(bytes));
      CUDA_CHECK(cudaMallocHost(&b.ptr, b.bytes));
      CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
    }
    in_flight_.push_back(b);  // before the calls that may throw: the block is never lost
    std::memcpy(b.ptr, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, b.ptr, bytes, cudaMemcpyHostToDevice, compute_stream()));
    CUDA_CHECK(cudaEventRecord(b.done, compute_stream()));
    return true;
  }

 private:
  struct Block {
    void* ptr = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded behind the block's last copy
    int device = 0;
  };
  std::mutex mu_;
  std::deque<Block> in_flight_;  // in the order their copies were issued
  std::vector<Block> free_;      // copies done: reusable
};

void copy_host_to_device_cuda(const Tensor& src_host, Tensor& dst) {
  check_transfer(src_host, dst, "copy_host_to_device");
  LOOM_CHECK(src_host.device().is_cpu() && dst.device().type == DeviceType::kCuda,
             "copy_host_to_device: ", src_host.device().str(), " → ", dst.device().str());
  if (dst.numel() == 0) return;
  CudaDeviceGuard guard(dst.device().index);
  const size_t bytes = dst.nbytes();
  if (bytes <= StagingBlocks::kMaxStagedBytes &&
      StagingBlocks::instance().upload(dst.raw_data(), src_host.raw_data(), bytes,
                                       dst.device().index)) {
    return;
  }
  CUDA_CHECK(cudaMemcpy(dst.raw_data(), src_host.raw_data(), bytes, cudaMemcpyHostToDevice));
}

void copy_device_to_host_cuda(const Tensor& src, Tensor& dst_host) {
  check_transfer(src, dst_host, "copy_device_to_host");
  LOOM_CHECK(src.device().type == DeviceType::kCuda && dst_host.device().is_cpu(),
             "copy_device_to_host: ", src.device().str(), " → ", dst_host.device().str());
  if (src.numel() == 0) return;
  CudaDeviceGuard guard(src.device().index);
  CUDA_CHECK(cudaMemcpy(dst_host.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDeviceToHost));
}

// Errors that mean "this process sees no usable GPU" rather than a fault.
bool means_no_device(cudaError_t err) {
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorInitializationError:
      return true;
    default:
      return false;
  }
}

int device_count_cuda() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaSuccess) return n;
  if (means_no_device(err)) {
    (void)cudaGetLastError();  // clear it, so later launch checks do not report it
    return 0;
  }
  CUDA_CHECK(err);
  return 0;
}

std::string device_name_cuda(int index) {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

void set_current_device_cuda(int index) {
  LOOM_CHECK(index >= 0 && index < device_count_cuda(), "cuda: no device ", index, " (",
             device_count_cuda(), " visible)");
  CUDA_CHECK(cudaSetDevice(index));
}

}  // namespace

LOOM_REGISTER_KERNEL(copy, kCuda, copy_cuda);
LOOM_REGISTER_KERNEL(fill, kCuda, fill_cuda);
LOOM_REGISTER_KERNEL(copy_host_to_device, kCuda, copy_host_to_device_cuda);
LOOM_REGISTER_KERNEL(copy_device_to_host, kCuda, copy_device_to_host_cuda);
LOOM_REGISTER_KERNEL(device_count, kCuda, device_count_cuda);
LOOM_REGISTER_KERNEL(device_name, kCuda, device_name_cuda);
LOOM_REGISTER_KERNEL(set_current_device, kCuda, set_current_device_cuda);

}  // namespace loom::kernels::cuda
