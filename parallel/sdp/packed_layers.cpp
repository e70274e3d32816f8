// parallel/sdp/packed_layers.cpp — the packed MLP layers and forward masking's factory (see the
// header, Notes [SDP packed MLP], [SDP packed init], [SDP placements]).
#include "parallel/sdp/packed_layers.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/view.h"
#include "core/placement.h"

namespace loom::parallel::sdp {
namespace {

int64_t count_of(const UnitRanges& ranges) {
  int64_t n = 0;
  for (const auto& [begin, end] : ranges) n += end - begin;
  return n;
}

// Ranges non-empty, ascending, disjoint and within [0, units).
void check_ranges(const UnitRanges& ranges, int64_t units, const char* what) {
  LOOM_CHECK(!ranges.empty(), what, ": no units kept (of ", units, ")");
  int64_t prev = 0;
  for (const auto& [begin, end] : ranges) {
    LOOM_CHECK(begin >= prev && begin < end && end <= units, what, ": unit range [", begin, ", ",
               end, ") is empty, out of order or outside [0, ", units, ")");
    prev = end;
  }
}

// dst ← src (the same shape), outside autograd.
void assign(Tensor dst, const Tensor& src, const char* what) {
  LOOM_CHECK(dst.shape() == src.shape(), what, ": part ", shape_str(src.shape()),
             " does not match the parameter ", shape_str(dst.shape()));
  autograd::NoGradGuard no_grad;
  ops::copy_(dst, src.to(dst.device()));
}

// The ranges of dim `dim` of `full`, concatenated in order (what packing keeps).
Tensor keep_units(const Tensor& full, int64_t dim, const UnitRanges& ranges) {
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> parts;
  for (const auto& [begin, end] : ranges)
    parts.push_back(ops::narrow(full, dim, begin, end - begin));
  return ops::contiguous(parts.size() == 1 ? parts[0] : ops::cat(parts, dim));
}

// Note [SDP placements]: dim `dim` of t holds `ranges` of a global dim of `units`, in order.
void place_packed(Tensor& t, int64_t dim, int64_t units, const UnitRanges& ranges) {
  Placement p;
  p.global_shape = t.shape();
  p.global_shape[static_cast<size_t>(dim)] = units;
  PlacementSplit split{dim, kAxisSdp, {}};
  int64_t local = 0;
  for (const auto& [begin, end] : ranges) {
    split.runs.push_back({local, begin, end - begin});
    local += end - begin;
  }
  p.splits.push_back(std::move(split));
  t.set_placement(std::move(p));
}

}  // namespace

PackedColumnLinear::PackedColumnLinear(int64_t in_features, int64_t units, UnitRanges ranges,
                                       bool bias, DType dtype, Device device)
    : in_features_(in_features), units_(units), ranges_(std::move(ranges)) {
  LOOM_CHECK(in_features > 0 && units > 0, "PackedColumnLinear: sizes must be positive, got in ",
             in_features, ", units ", units);
  check_ranges(ranges_, units, "PackedColumnLinear");
  const int64_t owned = count_of(ranges_);
  weight_ = register_parameter("weight", Tensor::zeros({owned, in_features}, dtype, device));
  place_packed(weight_, 0, units, ranges_);
  if (bias) {
    bias_ = register_parameter("bias", Tensor::zeros({owned}, dtype, device));
    place_packed(bias_, 0, units, ranges_);
  }
}

Tensor PackedColumnLinear::forward(const Tensor& x) const {
  LOOM_CHECK(x.dim() >= 1 && x.size(-1) == in_features_, "PackedColumnLinear: input ",
             shape_str(x.shape()), " does not end in in_features ", in_features_);
  // Note [Compute dtype]: as Linear::forward.
  return ops::linear(x, compute(weight_), bias_.defined() ? compute(bias_) : Tensor());
}

void PackedColumnLinear::init(Generator& gen, double std) {
  const Tensor full =
      randn({units_, in_features_}, gen, weight_.dtype(), 0.0, std, weight_.device());
  assign(weight_, keep_units(full, 0, ranges_), "PackedColumnLinear.init");
  if (bias_.defined())
    assign(bias_, Tensor::zeros(bias_.shape(), bias_.dtype()), "PackedColumnLinear.init");
}

void PackedColumnLinear::zero_rows_from(int64_t global_row) {
  autograd::NoGradGuard no_grad;
  int64_t local = 0;
  for (const auto& [begin, end] : ranges_) {
    const int64_t from = std::max(begin, global_row);
    if (from < end) {
      Tensor rows = ops::narrow(weight_, 0, local + from - begin, end - from);
      ops::copy_(rows, Tensor::zeros(rows.shape(), weight_.dtype(), weight_.device()));
    }
    local += end - begin;
  }
}

PackedRowLinear::PackedRowLinear(int64_t units, int64_t out_features, UnitRanges ranges, bool bias,
                                 double scale, DType dtype, Device device)
    : units_(units), out_features_(out_features), ranges_(std::move(ranges)), scale_(scale) {
  LOOM_CHECK(units > 0 && out_features > 0, "PackedRowLinear: sizes must be positive, got units ",
             units, ", out ", out_features);
  LOOM_CHECK(scale > 0, "PackedRowLinear: the scale must be positive, got ", scale);
  check_ranges(ranges_, units, "PackedRowLinear");
  weight_ =
      register_parameter("weight", Tensor::zeros({out_features, count_of(ranges_)}, dtype, device));
  place_packed(weight_, 1, units, ranges_);
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({out_features}, dtype, device));
}

Tensor PackedRowLinear::forward(const Tensor& x) const {
  LOOM_CHECK(x.dim() >= 1 && x.size(-1) == weight_.size(1), "PackedRowLinear: input ",
             shape_str(x.shape()), " does not end in the ", weight_.size(1), " units held");
  const Tensor b = bias_.defined() ? compute(bias_) : Tensor();   // Note [Compute dtype]
  if (scale_ == 1.0) return ops::linear(x, compute(weight_), b);  // plain
  // Note [SDP packed MLP]: the partial sum over the held units, rescaled; the bias once.
  const Tensor y = ops::scale(ops::linear(x, compute(weight_), Tensor()), scale_);
  return b.defined() ? ops::add(y, b) : y;
}

void PackedRowLinear::init(Generator& gen, double std) {
  const Tensor full =
      randn({out_features_, units_}, gen, weight_.dtype(), 0.0, std, weight_.device());
  assign(weight_, keep_units(full, 1, ranges_), "PackedRowLinear.init");
  if (bias_.defined())
    assign(bias_, Tensor::zeros(bias_.shape(), bias_.dtype()), "PackedRowLinear.init");
}

void PackedRowLinear::zero_rows_from(int64_t global_row) {
  if (global_row >= weight_.size(0)) return;
  autograd::NoGradGuard no_grad;
  Tensor rows = ops::narrow(weight_, 0, global_row, weight_.size(0) - global_row);
  ops::copy_(rows, Tensor::zeros(rows.shape(), weight_.dtype(), weight_.device()));
}

ForwardMaskingLinear::ForwardMaskingLinear(NeuronAssignment assignment, int worker)
    : assignment_(std::move(assignment)), worker_(worker), plain_(single_device_linear()) {
  LOOM_CHECK(worker >= 0 && worker < assignment_.workers, "ForwardMaskingLinear: worker ", worker,
             " outside the ", assignment_.workers, " SDP workers");
  LOOM_CHECK(assignment_.replication >= 1 && assignment_.replication <= assignment_.workers,
             "ForwardMaskingLinear: replication ", assignment_.replication, " of ",
             assignment_.workers, " workers");
}

double ForwardMaskingLinear::scale() const {
  return static_cast<double>(assignment_.workers) / static_cast<double>(assignment_.replication);
}

UnitRanges ForwardMaskingLinear::owned_ranges(int64_t layer, int64_t hidden) const {
  const auto n = static_cast<int64_t>(assignment_.layers.size());
  LOOM_CHECK(layer >= 0 && layer < n, "ForwardMaskingLinear: block ", layer,
             " is outside the SDP assignment's ", n, " layers (model.n_layer)");
  const LayerCover& cover = assignment_.layers[static_cast<size_t>(layer)];
  LOOM_CHECK(cover.units == hidden, "ForwardMaskingLinear: block ", layer, "'s MLP has ", hidden,
             " hidden units but the SDP assignment covers ", cover.units, " (model.ffn_hidden)");
  return cover.owned_ranges(worker_);
}

std::unique_ptr<LinearLayer> ForwardMaskingLinear::column(int64_t in,
                                                          const std::vector<int64_t>& segments,
                                                          bool bias, DType dtype,
                                                          Device device) const {
  return plain_->column(in, segments, bias, dtype, device);
}

std::unique_ptr<LinearLayer> ForwardMaskingLinear::row(int64_t in, int64_t out, bool bias,
                                                       DType dtype, Device device) const {
  return plain_->row(in, out, bias, dtype, device);
}

std::unique_ptr<LinearLayer> ForwardMaskingLinear::mlp_in(int64_t layer, int64_t in, int64_t hidden,
                                                          bool bias, DType dtype,
                                                          Device device) const {
  return std::make_unique<PackedColumnLinear>(in, hidden, owned_ranges(layer, hidden), bias, dtype,
                                              device);
}

std::unique_ptr<LinearLayer> ForwardMaskingLinear::mlp_out(int64_t layer, int64_t hidden,
                                                           int64_t out, bool bias, DType dtype,
                                                           Device device) const {
  return std::make_unique<PackedRowLinear>(hidden, out, owned_ranges(layer, hidden), bias, scale(),
                                           dtype, device);
}

std::unique_ptr<EmbeddingLayer> ForwardMaskingLinear::vocab_embedding(int64_t rows, int64_t dim,
                                                                      DType dtype,
                                                                      Device device) const {
  return plain_->vocab_embedding(rows, dim, dtype, device);
}

LayerContext forward_masking_context(NeuronAssignment assignment, int worker) {
  LayerContext ctx;
  ctx.linear = std::make_shared<const ForwardMaskingLinear>(std::move(assignment), worker);
  return ctx;
}

}  // namespace loom::parallel::sdp
