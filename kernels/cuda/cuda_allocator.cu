// kernels/cuda/cuda_allocator.cu — the CUDA caching allocator, registered for DeviceType::kCuda
// at static-initialisation time. Counts current/peak bytes (requested sizes, like the CPU
// allocator) with ByteCounter. Must not call cudaMalloc/cudaFree in steady state, and must not
// touch the CUDA runtime before the first allocation (static init runs before main()).
//
// Note [CUDA caching allocator]
// cudaMalloc and cudaFree synchronise the device and cost tens of microseconds, so blocks are
// cached per device in a BlockCache (Note [Block cache] in core/block_cache.h): a training loop
// that repeats the same shapes reaches a steady state with no cudaMalloc at all. If cudaMalloc
// runs out of memory, the device's cached blocks are released and the call is retried once.
// The statistics count requested bytes of live blocks; cached bytes are not "current".
//
// Not stream-aware: a freed block is handed out again at once. That is safe because one thread
// issues all compute, on its compute stream, where work runs in order (kernels, device copies,
// the asynchronous uploads and read-backs: the next user of a block cannot overtake the last
// one), and communication keeps its tensors alive until its completion event (Note [Streams] in
// docs/cuda.md). Compute issued from several threads would need per-block stream records.
//
// Cached blocks are not freed at exit: the CUDA context owns them and goes away with the
// process; calling cudaFree from a static destructor may run after the runtime is torn down.
#include <cuda_runtime.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/block_cache.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"

namespace loom::kernels::cuda {
namespace {

struct DeviceCache {
  BlockCache free_blocks;                  // freed blocks, ready for reuse
  std::unordered_map<void*, size_t> live;  // block handed out → its block size
  size_t reserved_bytes = 0;               // everything obtained from cudaMalloc
};

class CudaCachingAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, int device_index) override {
    LOOM_CHECK(device_index >= 0, "cuda allocator: bad device index ", device_index);
    std::lock_guard<std::mutex> lock(mu_);
    DeviceCache& cache = device(device_index);
    size_t size = BlockCache::block_size_for(bytes);
    void* block = cache.free_blocks.take(size, &size);
    if (block == nullptr) block = device_malloc(cache, size, bytes, device_index);
    cache.live.emplace(block, size);
    counter_.add(static_cast<int64_t>(bytes));
    return block;
  }

  // Called from Storage's destructor: never throws for a block this allocator handed out.
  void deallocate(void* ptr, size_t bytes, int device_index) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    DeviceCache& cache = device(device_index);
    auto it = cache.live.find(ptr);
    LOOM_CHECK(it != cache.live.end(),
               "cuda allocator: freeing a block it does not own on cuda:", device_index);
    cache.free_blocks.put(ptr, it->second);
    cache.live.erase(it);
    counter_.sub(static_cast<int64_t>(bytes));
  }

  AllocatorStats stats() const override {
    AllocatorStats s = counter_.stats();
    std::lock_guard<std::mutex> lock(mu_);
    for (const DeviceCache& d : devices_)
      s.reserved_bytes += static_cast<int64_t>(d.reserved_bytes);
    return s;
  }
  void reset_peak() override { counter_.reset_peak(); }
  void release_cached() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < devices_.size(); ++i) {
      CudaDeviceGuard guard(static_cast<int>(i));
      release_cached(devices_[i]);
    }
  }

 private:
  DeviceCache& device(int index) {
    if (static_cast<size_t>(index) >= devices_.size())
      devices_.resize(static_cast<size_t>(index) + 1);
    return devices_[static_cast<size_t>(index)];
  }

  // cudaMalloc on the device, releasing the cache and retrying once when memory is short.
  void* device_malloc(DeviceCache& cache, size_t size, size_t requested, int index) {
    CudaDeviceGuard guard(index);
    void* block = nullptr;
    cudaError_t err = cudaMalloc(&block, size);
    if (err == cudaErrorMemoryAllocation && cache.free_blocks.cached_bytes() > 0) {
      (void)cudaGetLastError();
      release_cached(cache);
      err = cudaMalloc(&block, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      const AllocatorStats s = counter_.stats();
      LOOM_FAIL("cuda allocator: out of memory on cuda:", index, " allocating ", requested,
                " bytes (block ", size, "); in use ", s.current_bytes, " bytes, peak ",
                s.peak_bytes, ", reserved ", cache.reserved_bytes);
    }
    CUDA_CHECK(err);
    cache.reserved_bytes += size;
    return block;
  }

  // Frees every cached block of one device (the current device is already that one).
  static void release_cached(DeviceCache& cache) {
    cache.free_blocks.release_all([&](void* block, size_t size) {
      CUDA_CHECK(cudaFree(block));
      cache.reserved_bytes -= size;
    });
  }

  mutable std::mutex mu_;
  std::vector<DeviceCache> devices_;  // by device index, grown on first use
  ByteCounter counter_;
};

// Registers the allocator before main(); constructing it touches no CUDA API.
// See Note [Process-wide registries] in core/allocator.h.
struct CudaAllocatorRegistrar {
  CudaAllocatorRegistrar() {
    static CudaCachingAllocator allocator;
    register_allocator(DeviceType::kCuda, &allocator);
  }
};
const CudaAllocatorRegistrar kCudaAllocatorRegistrar;

}  // namespace
}  // namespace loom::kernels::cuda
