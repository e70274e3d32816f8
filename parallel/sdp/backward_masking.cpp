// parallel/sdp/backward_masking.cpp — the split layers and backward masking's factory (with its
// heads option; see the header, Notes [SDP backward masking layers], [SDP backward-masked
// heads], [SDP frozen parameters]).
#include "parallel/sdp/backward_masking.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/view.h"

namespace loom::parallel::sdp {
namespace {

// The units of [from, to) outside `ranges` (ascending, disjoint), as ascending ranges.
UnitRanges complement(const UnitRanges& ranges, int64_t from, int64_t to) {
  UnitRanges out;
  int64_t next = from;
  for (const auto& [begin, end] : ranges) {
    const int64_t b = std::max(begin, from), e = std::min(end, to);
    if (b >= e) continue;
    if (b > next) out.emplace_back(next, b);
    next = e;
  }
  if (next < to) out.emplace_back(next, to);
  return out;
}

// How many units of [from, to) `ranges` hold.
int64_t count_within(const UnitRanges& ranges, int64_t from, int64_t to) {
  int64_t n = 0;
  for (const auto& [begin, end] : ranges)
    n += std::max<int64_t>(0, std::min(end, to) - std::max(begin, from));
  return n;
}

// The parts of the last dim of y of the given sizes (views; none for a size 0).
std::vector<Tensor> parts_of(const Tensor& y, const std::vector<int64_t>& sizes) {
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t n : sizes) {
    out.push_back(n > 0 ? ops::narrow(y, y.dim() - 1, at, n) : Tensor());
    at += n;
  }
  return out;
}

}  // namespace

BackwardMaskedLinear::BackwardMaskedLinear(int64_t units, UnitRanges owned, const char* what,
                                           std::vector<int64_t> segments)
    : units_(units), owned_(std::move(owned)) {
  LOOM_CHECK(units > 0, what, ": the number of units must be positive, got ", units);
  check_ranges(owned_, units, what);
  if (segments.empty()) segments = {units};
  int64_t from = 0;
  for (int64_t n : segments) {
    LOOM_CHECK(n > 0, what, ": segment sizes must be positive, got ", n);
    const UnitRanges rest = complement(owned_, from, from + n);
    unowned_.insert(unowned_.end(), rest.begin(), rest.end());
    owned_per_segment_.push_back(count_within(owned_, from, from + n));
    unowned_per_segment_.push_back(n - owned_per_segment_.back());
    from += n;
  }
  LOOM_CHECK(from == units, what, ": the segments sum to ", from, ", not the ", units, " units");
}

int64_t BackwardMaskedLinear::owned_count() const { return count_of(owned_); }

BackwardMaskedColumnLinear::BackwardMaskedColumnLinear(int64_t in_features, int64_t units,
                                                       UnitRanges owned, bool bias, DType dtype,
                                                       Device device, std::vector<int64_t> segments)
    : BackwardMaskedLinear(units, std::move(owned), "BackwardMaskedColumnLinear",
                           std::move(segments)),
      in_features_(in_features) {
  LOOM_CHECK(in_features > 0, "BackwardMaskedColumnLinear: in_features must be positive, got ",
             in_features);
  const int64_t n_owned = owned_count(), n_frozen = units - n_owned;
  weight_ = register_parameter("weight", Tensor::zeros({n_owned, in_features}, dtype, device));
  place_packed(weight_, 0, units, owned_);
  if (bias) {
    bias_ = register_parameter("bias", Tensor::zeros({n_owned}, dtype, device));
    place_packed(bias_, 0, units, owned_);
  }
  if (n_frozen > 0) {  // not registered: requires_grad stays false
    frozen_weight_ = Tensor::zeros({n_frozen, in_features}, dtype, device);
    place_packed(frozen_weight_, 0, units, unowned_);
    if (bias) {
      frozen_bias_ = Tensor::zeros({n_frozen}, dtype, device);
      place_packed(frozen_bias_, 0, units, unowned_);
    }
  }
}

Tensor BackwardMaskedColumnLinear::forward(const Tensor& x) const {
  LOOM_CHECK(x.dim() >= 1 && x.size(-1) == in_features_, "BackwardMaskedColumnLinear: input ",
             shape_str(x.shape()), " does not end in in_features ", in_features_);
  // Note [Compute dtype]: as Linear::forward.
  const Tensor owned =
      ops::linear(x, compute(weight_), bias_.defined() ? compute(bias_) : Tensor());
  if (plain()) return owned;
  // The frozen part requires no grad, so linear skips its dW (and db) GEMM; dx flows through.
  const Tensor frozen = ops::linear(x, compute(frozen_weight_),
                                    frozen_bias_.defined() ? compute(frozen_bias_) : Tensor());
  if (owned_per_segment_.size() == 1) return ops::cat({owned, frozen}, x.dim() - 1);
  // Note [SDP backward-masked heads]: per segment, its owned units, then its frozen ones.
  const std::vector<Tensor> o = parts_of(owned, owned_per_segment_),
                            f = parts_of(frozen, unowned_per_segment_);
  std::vector<Tensor> parts;
  for (size_t i = 0; i < o.size(); ++i) {
    if (o[i].defined()) parts.push_back(o[i]);
    if (f[i].defined()) parts.push_back(f[i]);
  }
  return ops::cat(parts, x.dim() - 1);
}

void BackwardMaskedColumnLinear::init(Generator& gen, double std) {
  const Tensor full = randn({units_, in_features_}, gen, weight_.dtype(), 0.0, std,
                            weight_.device());  // Note [SDP packed init]
  assign(weight_, keep_units(full, 0, owned_), "BackwardMaskedColumnLinear.init");
  if (bias_.defined())
    assign(bias_, Tensor::zeros(bias_.shape(), bias_.dtype()), "BackwardMaskedColumnLinear.init");
  if (frozen_weight_.defined())
    assign(frozen_weight_, keep_units(full, 0, unowned_), "BackwardMaskedColumnLinear.init");
  if (frozen_bias_.defined()) {
    assign(frozen_bias_, Tensor::zeros(frozen_bias_.shape(), frozen_bias_.dtype()),
           "BackwardMaskedColumnLinear.init");
  }
}

void BackwardMaskedColumnLinear::zero_rows_from(int64_t global_row) {
  zero_packed_rows(weight_, owned_, global_row);
  if (frozen_weight_.defined()) zero_packed_rows(frozen_weight_, unowned_, global_row);
}

BackwardMaskedRowLinear::BackwardMaskedRowLinear(int64_t units, int64_t out_features,
                                                 UnitRanges owned, bool bias, DType dtype,
                                                 Device device)
    : BackwardMaskedLinear(units, std::move(owned), "BackwardMaskedRowLinear"),
      out_features_(out_features) {
  LOOM_CHECK(out_features > 0, "BackwardMaskedRowLinear: out_features must be positive, got ",
             out_features);
  const int64_t n_owned = owned_count(), n_frozen = units - n_owned;
  weight_ = register_parameter("weight", Tensor::zeros({out_features, n_owned}, dtype, device));
  place_packed(weight_, 1, units, owned_);
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({out_features}, dtype, device));
  if (n_frozen > 0) {  // not registered: requires_grad stays false
    frozen_weight_ = Tensor::zeros({out_features, n_frozen}, dtype, device);
    place_packed(frozen_weight_, 1, units, unowned_);
  }
}

Tensor BackwardMaskedRowLinear::forward(const Tensor& x) const {
  LOOM_CHECK(x.dim() >= 1 && x.size(-1) == units_, "BackwardMaskedRowLinear: input ",
             shape_str(x.shape()), " does not end in the layer's ", units_, " units");
  const Tensor b = bias_.defined() ? compute(bias_) : Tensor();  // Note [Compute dtype]
  if (plain()) return ops::linear(x, compute(weight_), b);
  // x holds the owned units first (the column layer's order); the frozen columns' dW is skipped.
  const int64_t last = x.dim() - 1, n_owned = weight_.size(1);
  const Tensor owned = ops::linear(ops::narrow(x, last, 0, n_owned), compute(weight_), b);
  const Tensor frozen = ops::linear(ops::narrow(x, last, n_owned, units_ - n_owned),
                                    compute(frozen_weight_), Tensor());
  return ops::add(owned, frozen);
}

void BackwardMaskedRowLinear::init(Generator& gen, double std) {
  const Tensor full = randn({out_features_, units_}, gen, weight_.dtype(), 0.0, std,
                            weight_.device());  // Note [SDP packed init]
  assign(weight_, keep_units(full, 1, owned_), "BackwardMaskedRowLinear.init");
  if (bias_.defined())
    assign(bias_, Tensor::zeros(bias_.shape(), bias_.dtype()), "BackwardMaskedRowLinear.init");
  if (frozen_weight_.defined())
    assign(frozen_weight_, keep_units(full, 1, unowned_), "BackwardMaskedRowLinear.init");
}

void BackwardMaskedRowLinear::zero_rows_from(int64_t global_row) {
  zero_rows(weight_, global_row);
  zero_rows(frozen_weight_, global_row);
}

// Note [SDP frozen parameters]: weak references to each split tensor's two parts.
struct BackwardMaskingLinear::Record {
  std::mutex mutex;
  std::vector<std::pair<std::weak_ptr<TensorImpl>, std::weak_ptr<TensorImpl>>> pairs;
};

BackwardMaskingLinear::BackwardMaskingLinear(NeuronAssignment assignment, int worker,
                                             std::optional<NeuronAssignment> heads)
    : NeuronMaskingLinear(std::move(assignment), worker, "BackwardMaskingLinear", std::move(heads)),
      built_(std::make_shared<Record>()) {}

void BackwardMaskingLinear::record(const BackwardMaskedLinear& layer) const {
  const std::lock_guard<std::mutex> lock(built_->mutex);
  if (layer.frozen_weight().defined())
    built_->pairs.emplace_back(layer.weight().impl_ptr(), layer.frozen_weight().impl_ptr());
  if (layer.frozen_bias().defined())
    built_->pairs.emplace_back(layer.bias().impl_ptr(), layer.frozen_bias().impl_ptr());
}

std::vector<std::pair<Tensor, Tensor>> BackwardMaskingLinear::built_pairs() const {
  const std::lock_guard<std::mutex> lock(built_->mutex);
  std::vector<std::pair<Tensor, Tensor>> out;
  for (const auto& [owned, frozen] : built_->pairs) {
    std::shared_ptr<TensorImpl> o = owned.lock(), f = frozen.lock();
    if (o != nullptr && f != nullptr) out.emplace_back(Tensor(std::move(o)), Tensor(std::move(f)));
  }
  return out;
}

std::unique_ptr<LinearLayer> BackwardMaskingLinear::mlp_in(int64_t layer, int64_t in,
                                                           int64_t hidden, bool bias, DType dtype,
                                                           Device device) const {
  auto fc = std::make_unique<BackwardMaskedColumnLinear>(in, hidden, owned_ranges(layer, hidden),
                                                         bias, dtype, device);
  record(*fc);
  return fc;
}

std::unique_ptr<LinearLayer> BackwardMaskingLinear::mlp_out(int64_t layer, int64_t hidden,
                                                            int64_t out, bool bias, DType dtype,
                                                            Device device) const {
  auto proj = std::make_unique<BackwardMaskedRowLinear>(hidden, out, owned_ranges(layer, hidden),
                                                        bias, dtype, device);
  record(*proj);
  return proj;
}

std::unique_ptr<LinearLayer> BackwardMaskingLinear::attn_in(int64_t layer, int64_t in,
                                                            const std::vector<int64_t>& segments,
                                                            bool bias, DType dtype,
                                                            Device device) const {
  if (heads() == nullptr) return column(in, segments, bias, dtype, device);
  UnitRanges rows = head_rows(layer, segments);  // Note [SDP backward-masked heads]
  auto qkv = std::make_unique<BackwardMaskedColumnLinear>(
      in, segments[0] + 2 * segments[1], std::move(rows), bias, dtype, device, segments);
  record(*qkv);
  return qkv;
}

std::unique_ptr<LinearLayer> BackwardMaskingLinear::attn_out(int64_t layer, int64_t in, int64_t out,
                                                             bool bias, DType dtype,
                                                             Device device) const {
  if (heads() == nullptr) return row(in, out, bias, dtype, device);
  auto proj = std::make_unique<BackwardMaskedRowLinear>(in, out, head_columns(layer, in), bias,
                                                        dtype, device);
  record(*proj);
  return proj;
}

LayerContext backward_masking_context(NeuronAssignment assignment, int worker,
                                      std::optional<NeuronAssignment> heads) {
  LayerContext ctx;
  ctx.linear = std::make_shared<const BackwardMaskingLinear>(std::move(assignment), worker,
                                                             std::move(heads));
  return ctx;
}

namespace {

// Note [SDP frozen parameters]: (name of `owned`, frozen) for each pair whose owned tensor is
// among `named` (by handle), in `named`'s order; a pair whose owned tensor is not there is an
// error when `strict`, else skipped.
std::vector<std::pair<std::string, Tensor>> match_frozen(
    const std::vector<std::pair<Tensor, Tensor>>& pairs,
    const std::vector<std::pair<std::string, Tensor>>& named, bool strict) {
  std::map<const TensorImpl*, size_t> index;  // a parameter's handle → its position in `named`
  for (size_t i = 0; i < named.size(); ++i) index[named[i].second.impl()] = i;
  std::map<size_t, Tensor> found;  // ordered by position
  for (const auto& [owned, frozen] : pairs) {
    const auto it = index.find(owned.impl());
    if (it == index.end()) {
      LOOM_CHECK(!strict, "frozen_parameters: a backward-masked layer's owned tensor ",
                 shape_str(owned.shape()), " is not among the model's parameters");
      continue;
    }
    LOOM_CHECK(found.emplace(it->second, frozen).second,
               "frozen_parameters: ", named[it->second].first, " has two frozen parts");
  }
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(found.size());
  for (auto& [i, t] : found) {  // the frozen part is the same parameter: its owned part's role
    Tensor frozen = t;
    if (const ParamRole* role = named[i].second.role()) frozen.set_role(*role);
    out.emplace_back(named[i].first, frozen);
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> frozen_parameters(const Module& model) {
  std::vector<std::pair<Tensor, Tensor>> pairs;
  model.for_each_module([&](const Module& m) {
    const auto* layer = dynamic_cast<const BackwardMaskedLinear*>(&m);
    if (layer == nullptr) return;
    if (layer->frozen_weight().defined())
      pairs.emplace_back(layer->weight(), layer->frozen_weight());
    if (layer->frozen_bias().defined()) pairs.emplace_back(layer->bias(), layer->frozen_bias());
  });
  return match_frozen(pairs, model.named_parameters(), true);
}

std::vector<std::pair<std::string, Tensor>> frozen_parameters(
    const BackwardMaskingLinear& factory,
    const std::vector<std::pair<std::string, Tensor>>& named_params) {
  return match_frozen(factory.built_pairs(), named_params, false);
}

}  // namespace loom::parallel::sdp
