// core/block_cache.h — the free list shared by the caching allocators (CPU large blocks, CUDA).
//
// Note [Block cache]: requests are rounded up (to 512 B; above 1 MiB to a multiple of 2 MiB) so
// that similar sizes share blocks. A freed block is kept, keyed by its size; a request takes the
// smallest cached block of at least its rounded size and at most twice it (blocks are never
// split, so the cap bounds the waste). A loop that repeats the same shapes therefore reaches a
// steady state with no call to the system allocator: no page faults on the CPU, no cudaMalloc
// (which synchronises the device) on the GPU. Shapes that grow from step to step (packed
// micro-batches) pass every cached block now and then; the CPU allocator then grows the largest
// smaller one (take_below; Note [Growing a block] in core/allocator.cpp). Not thread-safe: the
// owning allocator locks.
#pragma once

#include <cstddef>
#include <map>

namespace loom {

class BlockCache {
 public:
  static constexpr size_t kSmallRound = 512;
  static constexpr size_t kLargeThreshold = size_t{1} << 20;
  static constexpr size_t kLargeRound = size_t{2} << 20;

  // The block size a request of `bytes` is served with.
  static size_t block_size_for(size_t bytes) {
    if (bytes <= kLargeThreshold) return bytes == 0 ? kSmallRound : round_up(bytes, kSmallRound);
    return round_up(bytes, kLargeRound);
  }

  // A cached block of size in [size, 2·size], or null; *got receives its size.
  void* take(size_t size, size_t* got) {
    auto it = free_.lower_bound(size);
    if (it == free_.end() || it->first > 2 * size) return nullptr;
    void* block = it->second;
    *got = it->first;
    cached_bytes_ -= it->first;
    free_.erase(it);
    return block;
  }

  // The largest cached block smaller than `size` (to be grown: Note [Growing a block] in
  // core/allocator.cpp), or null; *got receives its size.
  void* take_below(size_t size, size_t* got) {
    auto it = free_.lower_bound(size);
    if (it == free_.begin()) return nullptr;
    --it;
    void* block = it->second;
    *got = it->first;
    cached_bytes_ -= it->first;
    free_.erase(it);
    return block;
  }

  void put(void* block, size_t size) {
    free_.emplace(size, block);
    cached_bytes_ += size;
  }

  // Hands every cached block to free_fn(block, size) and forgets them.
  template <typename F>
  void release_all(F&& free_fn) {
    for (const auto& [size, block] : free_) free_fn(block, size);
    free_.clear();
    cached_bytes_ = 0;
  }

  size_t cached_bytes() const { return cached_bytes_; }

 private:
  static size_t round_up(size_t bytes, size_t multiple) {
    return (bytes + multiple - 1) / multiple * multiple;
  }

  std::multimap<size_t, void*> free_;  // block size → block
  size_t cached_bytes_ = 0;
};

}  // namespace loom
