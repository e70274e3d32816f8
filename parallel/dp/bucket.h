// parallel/dp/bucket.h — the layout of data-parallel gradient buckets: which parameters share a
// bucket, where each sits in the bucket's flat buffer, and how the flat buffer is padded so it
// splits into equal shards. Also re-homes parameters into flat buffers (Note [Re-homed
// parameters]). Pure layout and memory moves: no communication and no autograd here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace loom::parallel::dp {

// One bucket: parameters (indices into the list given to plan_buckets) with the element offset of
// each in the flat buffer. padded_numel is numel rounded up to a multiple of
// shard_count · kShardAlign, so shard i is [i·shard_numel, (i+1)·shard_numel) and every shard
// starts 64-byte aligned for f32. Padding elements are zero and belong to no parameter.
struct BucketPlan {
  DType dtype = DType::kF32;
  std::vector<size_t> params;    // in buffer order (reverse registration order)
  std::vector<int64_t> offsets;  // element offset of params[k] in the flat buffer
  int64_t numel = 0;             // Σ parameter numels
  int64_t padded_numel = 0;      // numel rounded up (see above)
  int64_t shard_numel = 0;       // padded_numel / shard_count
  size_t bytes() const { return static_cast<size_t>(numel) * dtype_size(dtype); }
};

inline constexpr int64_t kShardAlign = 16;  // elements; 64 bytes of f32

// Assigns parameters to buckets in REVERSE list order (registration order is roughly forward
// order, so reverse is roughly the order backward finishes gradients). A bucket closes before a
// parameter that would take it past bucket_bytes, or whose dtype differs; a parameter larger
// than bucket_bytes gets a bucket of its own, as does every parameter `alone` names (when
// given: one flag per parameter). Every parameter must be a contiguous f32 or f64 tensor on the
// same device, and appear once.
std::vector<BucketPlan> plan_buckets(const std::vector<Tensor>& params, size_t bucket_bytes,
                                     int shard_count, const std::vector<bool>& alone = {});

// A contiguous view of `flat` (1-d) with `shape`, starting at element `offset`.
Tensor flat_view(const Tensor& flat, const Shape& shape, int64_t offset);

// Note [Re-homed parameters]: ZeRO shards each bucket's flat parameter space, so the parameters
// of a bucket must live in ONE flat buffer. rehome_parameter(p, flat, offset) copies p's values
// into flat[offset, offset + numel) and then rewires p's TensorImpl (fields public in
// core/tensor.h) to that storage: storage = flat's storage, offset = flat's offset + offset,
// strides contiguous. Every handle to the parameter (the layer's member, the module registry, a
// tied head) shares that TensorImpl, so the model now reads and writes the flat buffer, and the
// old storage is freed when nothing else holds it. Requirements: p is a leaf (no grad_fn) with
// no live views of its old storage that the caller still expects to alias it (a view taken
// before re-homing keeps the old storage and is no longer the parameter).
void rehome_parameter(const Tensor& p, const Tensor& flat, int64_t offset);

}  // namespace loom::parallel::dp
