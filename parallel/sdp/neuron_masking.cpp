// parallel/sdp/neuron_masking.cpp — what forward and backward masking share: the packed layers'
// helpers and NeuronMaskingLinear (see the header, Notes [SDP packed init], [SDP placements]).
#include "parallel/sdp/neuron_masking.h"

#include <algorithm>
#include <utility>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/view.h"
#include "core/placement.h"
#include "kernels/copy.h"

namespace loom::parallel::sdp {
namespace {

// The units `worker` holds in block `layer` of `a`, checked against the block's `hidden` size.
UnitRanges ranges_of(const NeuronAssignment& a, int worker, int64_t layer, int64_t hidden,
                     const char* what) {
  const auto n = static_cast<int64_t>(a.layers.size());
  LOOM_CHECK(layer >= 0 && layer < n, what, ": block ", layer, " is outside the SDP assignment's ",
             n, " layers (model.n_layer)");
  const LayerCover& cover = a.layers[static_cast<size_t>(layer)];
  LOOM_CHECK(cover.units == hidden, what, ": block ", layer, "'s MLP has ", hidden,
             " hidden units but the SDP assignment covers ", cover.units, " (model.ffn_hidden)");
  return cover.owned_ranges(worker);
}

void check_worker(const NeuronAssignment& a, int worker, const char* what) {
  LOOM_CHECK(worker >= 0 && worker < a.workers, what, ": worker ", worker, " outside the ",
             a.workers, " SDP workers");
  LOOM_CHECK(a.replication >= 1 && a.replication <= a.workers, what, ": replication ",
             a.replication, " of ", a.workers, " workers");
}

}  // namespace

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

// Zeroes the rows (dim 0) of t whose global index is ≥ global_row, t holding `ranges` of the
// global rows in order.
void zero_packed_rows(Tensor& t, const UnitRanges& ranges, int64_t global_row) {
  autograd::NoGradGuard no_grad;
  int64_t local = 0;
  for (const auto& [begin, end] : ranges) {
    const int64_t from = std::max(begin, global_row);
    if (from < end) {
      Tensor rows = ops::narrow(t, 0, local + from - begin, end - from);
      kernels::call_kernel<kernels::fill_k>(rows, 0.0);
    }
    local += end - begin;
  }
}

// Zeroes rows [global_row, rows) of t (all its rows are global).
void zero_rows(Tensor& t, int64_t global_row) {
  if (!t.defined() || global_row >= t.size(0)) return;
  autograd::NoGradGuard no_grad;
  Tensor rows = ops::narrow(t, 0, global_row, t.size(0) - global_row);
  kernels::call_kernel<kernels::fill_k>(rows, 0.0);
}

NeuronMaskingLinear::NeuronMaskingLinear(NeuronAssignment assignment, int worker, const char* what,
                                         std::optional<NeuronAssignment> heads)
    : assignment_(std::move(assignment)),
      worker_(worker),
      what_(what),
      plain_(single_device_linear()),
      heads_(std::move(heads)) {
  check_worker(assignment_, worker_, what_);
  if (!heads_) return;
  check_worker(*heads_, worker, what_);
  LOOM_CHECK(
      heads_->workers == assignment_.workers && heads_->replication == assignment_.replication,
      what_, ": the heads cover has ", heads_->workers, " workers and ", heads_->replication,
      " holders per unit, the MLP cover ", assignment_.workers, " and ", assignment_.replication,
      ": they must be the same");
}

const LayerCover& NeuronMaskingLinear::head_cover(int64_t layer) const {
  LOOM_CHECK(heads_, what_, ": block ", layer, " has no heads cover");
  const auto n = static_cast<int64_t>(heads_->layers.size());
  LOOM_CHECK(layer >= 0 && layer < n, what_, ": block ", layer,
             " is outside the SDP heads cover's ", n, " layers (model.n_layer)");
  return heads_->layers[static_cast<size_t>(layer)];
}

UnitRanges NeuronMaskingLinear::head_rows(int64_t layer,
                                          const std::vector<int64_t>& segments) const {
  LOOM_CHECK(segments.size() == 3 && segments[1] == segments[2] && segments[1] > 0 &&
                 segments[0] % segments[1] == 0,
             what_, ": block ", layer,
             "'s attention input must be segments {q, k, v} with k = v dividing q");
  const LayerCover& cover = head_cover(layer);
  const int64_t q = segments[0], kv = segments[1], groups = cover.units;
  LOOM_CHECK(kv % groups == 0, what_, ": block ", layer, "'s ", kv,
             " k features are not whole heads of the SDP heads cover's ", groups,
             " kv groups (model.n_kv_head)");
  const int64_t d = kv / groups, qd = q / groups;  // per group: qd q rows, d k and d v rows
  const UnitRanges owned = cover.owned_ranges(worker());
  UnitRanges rows;  // Note [SDP packed heads]: q, then k, then v rows of the owned groups
  for (const auto& [u0, u1] : owned) rows.emplace_back(u0 * qd, u1 * qd);
  for (const auto& [u0, u1] : owned) rows.emplace_back(q + u0 * d, q + u1 * d);
  for (const auto& [u0, u1] : owned) rows.emplace_back(q + kv + u0 * d, q + kv + u1 * d);
  return rows;
}

UnitRanges NeuronMaskingLinear::head_columns(int64_t layer, int64_t in) const {
  const LayerCover& cover = head_cover(layer);
  LOOM_CHECK(in % cover.units == 0, what_, ": block ", layer, "'s ", in,
             " query features are not whole heads of the SDP heads cover's ", cover.units,
             " kv groups (model.n_kv_head)");
  const int64_t qd = in / cover.units;
  UnitRanges cols;
  for (const auto& [u0, u1] : cover.owned_ranges(worker())) cols.emplace_back(u0 * qd, u1 * qd);
  return cols;
}

UnitRanges NeuronMaskingLinear::owned_ranges(int64_t layer, int64_t hidden) const {
  return ranges_of(assignment_, worker_, layer, hidden, what_);
}

std::unique_ptr<LinearLayer> NeuronMaskingLinear::column(int64_t in,
                                                         const std::vector<int64_t>& segments,
                                                         bool bias, DType dtype,
                                                         Device device) const {
  return plain_->column(in, segments, bias, dtype, device);
}

std::unique_ptr<LinearLayer> NeuronMaskingLinear::row(int64_t in, int64_t out, bool bias,
                                                      DType dtype, Device device) const {
  return plain_->row(in, out, bias, dtype, device);
}

std::unique_ptr<EmbeddingLayer> NeuronMaskingLinear::vocab_embedding(int64_t rows, int64_t dim,
                                                                     DType dtype,
                                                                     Device device) const {
  return plain_->vocab_embedding(rows, dim, dtype, device);
}

}  // namespace loom::parallel::sdp
