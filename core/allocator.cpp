// core/allocator.cpp — byte counting, the CPU allocator and the per-device-type table.
#include "core/allocator.h"

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
// 4 KiB on first touch) are cached (Note [Block cache] in core/block_cache.h).
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
    cache_.release_all([](void* b, size_t) { std::free(b); });
  }

 private:
  // A cached block when one fits, else a fresh one (releasing the cache and retrying once when
  // memory is short).
  void* allocate_large(size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t got = size;
    void* p = cache_.take(size, &got);
    if (!p) {
      p = std::aligned_alloc(kCpuAlignment, size);
      if (!p) {
        cache_.release_all([](void* b, size_t) { std::free(b); });
        p = std::aligned_alloc(kCpuAlignment, size);
      }
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
