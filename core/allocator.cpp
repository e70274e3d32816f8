// core/allocator.cpp — byte counting, the CPU allocator and the per-device-type table.
#include "core/allocator.h"

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "core/block_cache.h"
#include "core/error.h"

namespace loom {

void ByteCounter::add(int64_t bytes) {
  const int64_t now = current_.fetch_add(bytes) + bytes;
  allocs_.fetch_add(1);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void ByteCounter::sub(int64_t bytes) { current_.fetch_sub(bytes); }

AllocatorStats ByteCounter::stats() const {
  return {current_.load(), peak_.load(), allocs_.load(), 0};
}

void ByteCounter::reset_peak() { peak_.store(current_.load()); }

namespace {

constexpr size_t kCpuAlignment = 64;

// Small blocks come from the C library; large ones (where fresh pages cost a page fault per
// 4 KiB on first touch) are mapped pages, cached (Note [Block cache] in core/block_cache.h).
//
// Note [Growing a block]: when no cached block fits a large request, the largest cached block
// below it is grown with mremap instead of mapping a fresh one: the kernel keeps its pages
// (already touched), so only the growth faults. Packed micro-batches grow a little at a time (a
// rank's longest so far, by 5 to 40 %), and their logits-sized buffers were fresh pages each
// time: on the 2-core VM test bed (sft-tiny, dp 2 DDP, balance none, 12 steps) the rank that met
// a new longest micro-batch spent up to 1.2 s of a 1.7 s step in page faults (3.8 s of system
// time, 491k minor faults); growing blocks: 0.5 s, 215k faults, the worst step 0.81 s
// (docs/planning.md, "Packed documents").
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, int /*device_index*/) override {
    const size_t size = BlockCache::block_size_for(bytes);
    void* p = bytes > BlockCache::kLargeThreshold ? allocate_large(size)
                                                  : std::aligned_alloc(kCpuAlignment, size);
    LOOM_CHECK(p != nullptr, "cpu allocator: out of memory allocating ", bytes, " bytes");
    counter_.add(static_cast<int64_t>(bytes));
    return p;
  }

  void deallocate(void* ptr, size_t bytes, int /*device_index*/) override {
    counter_.sub(static_cast<int64_t>(bytes));
    if (bytes > BlockCache::kLargeThreshold) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_.find(ptr);
      cache_.put(ptr, it->second);
      sizes_.erase(it);
    } else {
      std::free(ptr);
    }
  }

  AllocatorStats stats() const override { return counter_.stats(); }
  void reset_peak() override { counter_.reset_peak(); }
  void release_cached() override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.release_all(unmap);
  }

 private:
  static void unmap(void* block, size_t size) { ::munmap(block, size); }

  // A cached block when one fits, else the largest smaller one grown (Note [Growing a block]),
  // else fresh pages (releasing the cache and retrying once when memory is short). Mapped blocks
  // are page-aligned, beyond kCpuAlignment.
  void* allocate_large(size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t got = size;
    void* p = cache_.take(size, &got);
    size_t small = 0;
    if (!p) {
      if (void* old = cache_.take_below(size, &small)) {
        p = ::mremap(old, small, size, MREMAP_MAYMOVE);
        if (p == MAP_FAILED) {
          cache_.put(old, small);
          p = nullptr;
        }
      }
    }
    if (!p) {
      p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        cache_.release_all(unmap);
        p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      }
      if (p == MAP_FAILED) p = nullptr;
    }
    if (p) sizes_[p] = got;
    return p;
  }

  ByteCounter counter_;
  std::mutex mu_;
  BlockCache cache_;
  std::unordered_map<void*, size_t> sizes_;  // live large block → its block size
};

struct AllocatorTable {
  Allocator* by_type[kNumDeviceTypes] = {};
  AllocatorTable() {
    static CpuAllocator cpu;
    by_type[static_cast<int>(DeviceType::kCpu)] = &cpu;
  }
};

AllocatorTable& table() {
  static AllocatorTable t;
  return t;
}

}  // namespace

Allocator& allocator_for(DeviceType type) {
  Allocator* a = table().by_type[static_cast<int>(type)];
  LOOM_CHECK(a != nullptr, "no allocator for device ", device_type_name(type),
             " (this build has no ", device_type_name(type), " backend)");
  return *a;
}

void register_allocator(DeviceType type, Allocator* allocator) {
  table().by_type[static_cast<int>(type)] = allocator;
}

const char* device_type_name(DeviceType t) { return t == DeviceType::kCpu ? "cpu" : "cuda"; }

std::string Device::str() const {
  return type == DeviceType::kCpu ? "cpu" : "cuda:" + std::to_string(index);
}

}  // namespace loom
