// parallel/dp/grad_buckets.h — GradBuckets: one rank's data-parallel gradient buckets. It plans
// which parameters share a bucket (parallel/dp/bucket.h), re-homes them into each bucket's flat
// parameter buffer, keeps the flat gradient buffers their .grad views point into, counts each
// bucket down from the parameters' grad-ready hooks during backward and calls back when a bucket
// is complete, and says which range of every bucket this rank owns when the buckets are sharded.
// It communicates nothing and steps no optimizer: DataParallel launches a complete bucket's sync
// (parallel/dp/data_parallel.h), Zero3Gatherer gathers and releases parameter buffers
// (parallel/dp/zero3.h). Note [Data-parallel gradient flow] in parallel/dp/data_parallel.h says how
// the gradients reach the buckets.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "optim/decay_rule.h"
#include "parallel/dp/bucket.h"
#include "parallel/dp/dp_stats.h"

namespace loom::parallel {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

namespace dp {

struct BucketParam {
  std::string name;
  Tensor tensor;  // the parameter, re-homed into its bucket's param_flat
  bool decay = true;
  int bucket = 0;
  int64_t offset = 0;  // element offset in the bucket's flat buffers
};

struct GradBucket {
  BucketPlan plan;
  Tensor param_flat;    // (padded_numel); ZeRO-3 releases its memory between uses
  Tensor grad_flat;     // (padded_numel); undefined while not allocated
  Tensor grad_shard;    // (shard_numel) the owned reduced gradient, with shard_grads
  int pending = 0;      // gradient hooks still to fire in this backward
  bool sealed = false;  // its reduction is in flight: a gradient arriving now is an error
};

struct GradBucketsOptions {
  size_t bucket_bytes = 25u << 20;  // target bytes per bucket (with per_unit: one per unit)
  bool per_unit = false;            // one bucket per parameter unit
  int shard_count = 1;              // ranks the buckets' element ranges are split over
  int shard_rank = 0;
  bool shard_grads = false;  // keep a (shard_numel) grad_shard per bucket (ZeRO-2/3)
  optim::DecayRule decay_rule = optim::DecayRule::kDefault;
  // Parameters that get a bucket of their own (not with per_unit); empty: none.
  std::function<bool(const Tensor&)> alone;
};

class GradBuckets {
 public:
  // units: the parameters, as units (one bucket each with per_unit) or one list; frozen ones
  // are skipped. log: where the hooks record themselves; must outlive this object.
  GradBuckets(const std::vector<NamedTensors>& units, const GradBucketsOptions& options,
              DpStepLog& log);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Registers every parameter's grad-ready hook (once): it moves a gradient that is not in its
  // bucket there, counts the bucket down and calls on_complete(bucket) when the bucket's last
  // gradient of this backward has arrived.
  void install_hooks(std::function<void(int bucket)> on_complete);
  // Registers every parameter's partial hook (Note [Partial gradients] in core/autograd.h):
  // on_partial(param index, contribution) says whether it took an early contribution.
  void install_partial_hooks(std::function<bool(size_t param, const Tensor& g)> on_partial);

  int size() const { return static_cast<int>(buckets_.size()); }
  GradBucket& bucket(int b) { return buckets_.at(static_cast<size_t>(b)); }
  const GradBucket& bucket(int b) const { return buckets_.at(static_cast<size_t>(b)); }
  const std::vector<BucketParam>& params() const { return params_; }

  // Gradient buffers. ensure_grad_buffer allocates bucket b's (zeros) when it has none;
  // attach_grad_views points each of its parameters' .grad at its view; zero() zeroes (or
  // allocates) every bucket's, attaches them all and counts every bucket again.
  void ensure_grad_buffer(int b);
  void attach_grad_views(int b);
  void zero();
  void clear_grads();  // every parameter's .grad cleared (the buffers stay)
  // Frees bucket b's gradient buffer now (the parameters' .grad are cleared).
  void drop_grad_buffer(int b);
  // Hands bucket b's gradient buffer to a reduction still reading it (the parameters' .grad are
  // cleared); its bytes stay counted until grad_buffer_done(bytes).
  Tensor take_grad_buffer(int b);
  void grad_buffer_done(size_t bytes);
  int64_t grad_buffer_bytes() const { return grad_bytes_; }  // alive now
  int64_t peak_grad_buffer_bytes() const { return peak_grad_bytes_; }

  // Hook counting: every bucket that is not sealed counts all its parameters again; recount(b)
  // bucket b alone (its next backward, e.g. the next accumulation micro-batch).
  void reset_counts();
  void recount(int b);

  // Rank r owns elements [r·n, (r+1)·n) of every bucket, n = shard_numel.
  int shard_rank() const { return options_.shard_rank; }
  int shard_count() const { return options_.shard_count; }
  int64_t owned_begin(int b) const { return shard_rank() * bucket(b).plan.shard_numel; }
  // Calls fn(bucket, param, lo, hi) for every intersection [lo, hi) (bucket elements) of a
  // parameter with this rank's owned range, in bucket then buffer order.
  template <typename Fn>
  void for_each_owned_piece(Fn&& fn) const;

  int64_t num_parameters() const;                     // Ψ: elements over all parameters
  std::vector<std::string> param_names(int b) const;  // bucket b's, in buffer order

 private:
  struct HookLink {
    GradBuckets* owner = nullptr;
  };
  void build(const std::vector<NamedTensors>& units);
  void on_grad_ready(size_t index, Tensor& leaf);

  GradBucketsOptions options_;
  DpStepLog& log_;
  std::vector<BucketParam> params_;
  std::vector<GradBucket> buckets_;
  std::function<void(int)> on_complete_;
  std::shared_ptr<HookLink> link_;  // the hooks reach this object only while it lives
  int64_t grad_bytes_ = 0, peak_grad_bytes_ = 0;
};

template <typename Fn>
void GradBuckets::for_each_owned_piece(Fn&& fn) const {
  for (int bi = 0; bi < size(); ++bi) {
    const GradBucket& b = bucket(bi);
    const int64_t own_begin = owned_begin(bi);
    const int64_t own_end = own_begin + b.plan.shard_numel;
    for (size_t k : b.plan.params) {
      const BucketParam& p = params_[k];
      const int64_t lo = std::max(p.offset, own_begin);
      const int64_t hi = std::min(p.offset + p.tensor.numel(), own_end);
      if (lo < hi) fn(bi, p, lo, hi);
    }
  }
}

}  // namespace dp
}  // namespace loom::parallel
