// parallel/sdp/forward_masking.cpp — the packed layers and forward masking's factory (with its
// heads option; see the header, Notes [SDP packed MLP], [SDP packed heads]).
#include "parallel/sdp/forward_masking.h"

#include <utility>

#include "core/error.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"

namespace loom::parallel::sdp {

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
  zero_packed_rows(weight_, ranges_, global_row);
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

void PackedRowLinear::zero_rows_from(int64_t global_row) { zero_rows(weight_, global_row); }

ForwardMaskingLinear::ForwardMaskingLinear(NeuronAssignment assignment, int worker,
                                           std::optional<NeuronAssignment> heads)
    : NeuronMaskingLinear(std::move(assignment), worker, "ForwardMaskingLinear", std::move(heads)) {
}

double ForwardMaskingLinear::scale() const {
  return static_cast<double>(assignment().workers) / static_cast<double>(assignment().replication);
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

std::unique_ptr<LinearLayer> ForwardMaskingLinear::attn_in(int64_t layer, int64_t in,
                                                           const std::vector<int64_t>& segments,
                                                           bool bias, DType dtype,
                                                           Device device) const {
  if (heads() == nullptr) return column(in, segments, bias, dtype, device);
  UnitRanges rows = head_rows(layer, segments);
  return std::make_unique<PackedColumnLinear>(in, segments[0] + 2 * segments[1], std::move(rows),
                                              bias, dtype, device);
}

std::unique_ptr<LinearLayer> ForwardMaskingLinear::attn_out(int64_t layer, int64_t in, int64_t out,
                                                            bool bias, DType dtype,
                                                            Device device) const {
  if (heads() == nullptr) return row(in, out, bias, dtype, device);
  return std::make_unique<PackedRowLinear>(in, out, head_columns(layer, in), bias, scale(), dtype,
                                           device);
}

LayerContext forward_masking_context(NeuronAssignment assignment, int worker,
                                     std::optional<NeuronAssignment> heads) {
  LayerContext ctx;
  ctx.linear =
      std::make_shared<const ForwardMaskingLinear>(std::move(assignment), worker, std::move(heads));
  return ctx;
}

}  // namespace loom::parallel::sdp
