// parallel/dp/bucket.cpp — bucket planning (reverse order, byte budget, shard padding) and
// parameter re-homing (Note [Re-homed parameters] in parallel/dp/bucket.h).
#include "parallel/dp/bucket.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/ops/view.h"

namespace loom::parallel::dp {
namespace {

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

void check_param(const Tensor& p, const Tensor& first, size_t index) {
  LOOM_CHECK(p.defined(), "data_parallel: parameter ", index, " is undefined");
  LOOM_CHECK(p.dtype() == DType::kF32 || p.dtype() == DType::kF64, "data_parallel: parameter ",
             index, " is ", dtype_name(p.dtype()), "; gradient buckets hold f32 or f64");
  LOOM_CHECK(p.device() == first.device(), "data_parallel: parameter ", index, " is on ",
             p.device().str(), ", parameter 0 on ", first.device().str());
  LOOM_CHECK(p.is_contiguous(), "data_parallel: parameter ", index, " is not contiguous");
}

void close_bucket(BucketPlan& b, int shard_count, std::vector<BucketPlan>& out) {
  if (b.params.empty()) return;
  b.padded_numel = round_up(std::max<int64_t>(b.numel, 1), shard_count * kShardAlign);
  b.shard_numel = b.padded_numel / shard_count;
  out.push_back(std::move(b));
  b = BucketPlan{};
}

}  // namespace

std::vector<BucketPlan> plan_buckets(const std::vector<Tensor>& params, size_t bucket_bytes,
                                     int shard_count, const std::vector<bool>& alone) {
  LOOM_CHECK(shard_count >= 1, "data_parallel: shard count must be >= 1, got ", shard_count);
  LOOM_CHECK(bucket_bytes > 0, "data_parallel: bucket_bytes must be > 0");
  LOOM_CHECK(alone.empty() || alone.size() == params.size(), "data_parallel: ", alone.size(),
             " 'alone' flags for ", params.size(), " parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    check_param(params[i], params[0], i);
    for (size_t j = 0; j < i; ++j) {
      LOOM_CHECK(!params[i].same(params[j]), "data_parallel: parameters ", j, " and ", i,
                 " are the same tensor (list a tied parameter once)");
    }
  }
  std::vector<BucketPlan> out;
  BucketPlan cur;
  for (size_t k = params.size(); k-- > 0;) {
    const Tensor& p = params[k];
    const bool dtype_differs = !cur.params.empty() && cur.dtype != p.dtype();
    const bool own = !alone.empty() && alone[k];
    if (dtype_differs || own || (!cur.params.empty() && cur.bytes() + p.nbytes() > bucket_bytes)) {
      close_bucket(cur, shard_count, out);
    }
    cur.dtype = p.dtype();
    cur.params.push_back(k);
    cur.offsets.push_back(cur.numel);
    cur.numel += p.numel();
    if (own) close_bucket(cur, shard_count, out);
  }
  close_bucket(cur, shard_count, out);
  return out;
}

Tensor flat_view(const Tensor& flat, const Shape& shape, int64_t offset) {
  LOOM_CHECK(flat.dim() == 1 && flat.is_contiguous(), "flat_view: base must be 1-d contiguous");
  LOOM_CHECK(offset >= 0 && offset + shape_numel(shape) <= flat.numel(), "flat_view: [", offset,
             ", ", offset + shape_numel(shape), ") outside a buffer of ", flat.numel());
  return make_view(flat, shape, contiguous_strides(shape), flat.offset() + offset);
}

void rehome_parameter(const Tensor& p, const Tensor& flat, int64_t offset) {
  LOOM_CHECK(p.is_leaf(), "data_parallel: cannot re-home a non-leaf tensor");
  LOOM_CHECK(p.dtype() == flat.dtype() && p.device() == flat.device(),
             "data_parallel: re-homing needs the same dtype and device");
  Tensor dst = flat_view(flat, p.shape(), offset);
  {
    autograd::NoGradGuard no_grad;
    ops::copy_(dst, p.detach());
  }
  TensorImpl* impl = p.impl();
  impl->storage = flat.storage();
  impl->offset = flat.offset() + offset;
  impl->strides = contiguous_strides(impl->shape);
}

}  // namespace loom::parallel::dp
