// parallel/sdp/packed_layers.h — SDP forward masking at the neuron level (subnetwork data
// parallelism, arXiv 2507.09029; docs/parallel.md, "SDP"): the linear factory of worker w, whose
// blocks' MLPs keep only the hidden units w holds (parallel/sdp/assignment.h), packed into
// smaller dense weights. The GEMMs, the hidden activations, the gradients and hence the optimiser
// state really shrink: no mask is multiplied and nothing is communicated in forward or backward.
// Everything else (attention, embeddings, norms, the head) is built as on one device. This file
// only builds layers: the gradient sync over holder sets is parallel/sdp/slice_sync.h, and
// parallel/sdp/sdp_sync.h with train/plan.cpp compose them (Note [SDP plan] in train/plan.h).
//
// Note [SDP packed MLP]: for block l with U hidden units and worker w holding units
// O = owned_units(w, l) (⌊k·U/N⌋ or ⌈k·U/N⌉ of them, at most two ascending ranges):
//   fc, gate, up   PackedColumnLinear: W (|O|, d) = rows O of the full (U, d), bias rows O;
//   proj, down     PackedRowLinear: W (d, |O|) = columns O of the full (d, U); the bias whole;
//                  y = (1/C)·(h·Wᵀ) + b, with C = k/N the coverage (d: n_embd).
// A unit outside O contributes nothing, as if its activation were zeroed (GELU and SwiGLU map a
// zero pre-activation to zero), and the rescaling makes the full model's branch exactly the
// average over the N workers of their branches: every unit is held by k workers, and
// Σ_w (1/C)·Σ_{u∈O_w} c_u / N = Σ_u k·c_u / (C·N) = Σ_u c_u. The replicated bias is added
// once, unscaled, so the average of the workers' outputs is the full layer's output (decision 2
// of docs/parallel.md). At coverage 1 every unit is owned and the scale is 1: both layers are
// plain (LinearLayer::plain), the GPT-2 MLP runs fused, and the model is the single-device one.
// The scale is for training; evaluating or consolidating the full model uses the full weights,
// unscaled.
//
// Note [SDP packed init]: init() draws the full matrix exactly as Linear::init does (one randn
// of the full shape from the same generator) and keeps the owned rows or columns, so a worker's
// packed weights are the corresponding rows/columns of the single-process model's and the
// generator advances identically on every worker (later layers draw the same values).
//
// Note [SDP placements]: a packed weight's Placement splits its packed dim (0 for the column
// layer and its bias, 1 for the row layer) over the axis "sdp" with one run per owned range
// (local → global, ascending), so train/pieces.h names exactly the global elements it holds
// (piece_of). What Placement cannot say: that each run is also held by k − 1 other workers, and
// by which (its holder set). Its `replicated` list means "every rank along the axis holds the
// same values", and a split means "the ranks along the axis hold disjoint runs"; SDP's runs are
// neither. "sdp" is not a mesh axis: the SDP workers are the dp group, so data parallelism's
// marking would add "dp" to `replicated` and the global norm (parallel/gradients.h) would count
// only dp rank 0's slices. Counting each slice once needs holder information on the run (e.g. a
// holder list per PlacementRun, a run counted by its lowest holder) or a weight of 1/k per split
// run; neither exists yet. Checkpoints need the same: which holder writes a slice. The replicated
// bias of the row layer carries no placement (whole), like a default Linear's.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "layers/build_context.h"
#include "parallel/sdp/assignment.h"

namespace loom::parallel::sdp {

// The axis name of a packed weight's split (Note [SDP placements]); not a mesh axis.
inline constexpr const char* kAxisSdp = "sdp";

// Units [first, second) of a layer; a packed layer's ranges are ascending and disjoint.
using UnitRanges = std::vector<std::pair<int64_t, int64_t>>;

// The owned rows of a column layer: y = x·Wᵀ + b, W (owned, in) [sdp-packed dim 0], b (owned)
// [sdp-packed dim 0]. Its forward is Linear's (plain).
class PackedColumnLinear final : public LinearLayer {
 public:
  // `units` the full layer's out features, `ranges` the rows kept (non-empty, ascending,
  // disjoint, within [0, units)).
  PackedColumnLinear(int64_t in_features, int64_t units, UnitRanges ranges, bool bias,
                     DType dtype = DType::kF32, Device device = {});
  Tensor forward(const Tensor& x) const override;  // x (…, in) → (…, owned)
  void init(Generator& gen, double std) override;  // Note [SDP packed init]
  // Zeroes the packed rows whose global index is ≥ global_row.
  void zero_rows_from(int64_t global_row) override;
  bool plain() const override { return true; }
  const Tensor& weight() const override { return weight_; }
  const Tensor& bias() const override { return bias_; }
  const UnitRanges& ranges() const { return ranges_; }

 private:
  int64_t in_features_, units_;
  UnitRanges ranges_;
  Tensor weight_, bias_;
};

// The owned columns of a row layer: y = scale·(x·Wᵀ) + b, W (out, owned) [sdp-packed dim 1],
// b (out) whole and added once (Note [SDP packed MLP]). Plain when scale is 1.
class PackedRowLinear final : public LinearLayer {
 public:
  // `units` the full layer's in features, `ranges` the columns kept.
  PackedRowLinear(int64_t units, int64_t out_features, UnitRanges ranges, bool bias, double scale,
                  DType dtype = DType::kF32, Device device = {});
  Tensor forward(const Tensor& x) const override;  // x (…, owned) → (…, out)
  void init(Generator& gen, double std) override;  // Note [SDP packed init]
  void zero_rows_from(int64_t global_row) override;
  bool plain() const override { return scale_ == 1.0; }
  const Tensor& weight() const override { return weight_; }
  const Tensor& bias() const override { return bias_; }
  const UnitRanges& ranges() const { return ranges_; }
  double scale() const { return scale_; }

 private:
  int64_t units_, out_features_;
  UnitRanges ranges_;
  double scale_;
  Tensor weight_, bias_;
};

// Worker `worker`'s factory under forward masking (Note [SDP packed MLP]): mlp_in / mlp_out of
// block l are packed to the units the worker holds in layer l of `assignment` (whose layers are
// the model's blocks, in order, each covering the block's ffn hidden units); every other layer
// is the single-device one. The row layers scale by N / k. Errors name the block and the sizes
// when a block is outside the assignment or its hidden size differs from the cover's.
class ForwardMaskingLinear final : public LinearFactory {
 public:
  ForwardMaskingLinear(NeuronAssignment assignment, int worker);
  int feature_split() const override { return 1; }
  std::unique_ptr<LinearLayer> column(int64_t in, const std::vector<int64_t>& segments, bool bias,
                                      DType dtype, Device device) const override;
  std::unique_ptr<LinearLayer> row(int64_t in, int64_t out, bool bias, DType dtype,
                                   Device device) const override;
  std::unique_ptr<LinearLayer> mlp_in(int64_t layer, int64_t in, int64_t hidden, bool bias,
                                      DType dtype, Device device) const override;
  std::unique_ptr<LinearLayer> mlp_out(int64_t layer, int64_t hidden, int64_t out, bool bias,
                                       DType dtype, Device device) const override;
  std::unique_ptr<EmbeddingLayer> vocab_embedding(int64_t rows, int64_t dim, DType dtype,
                                                  Device device) const override;
  Tensor replicated_param(const Tensor& p) const override { return p; }
  Tensor column_input(const Tensor& x) const override { return x; }

  // 1/C = N / k: the row layers' scale.
  double scale() const;
  int worker() const { return worker_; }
  const NeuronAssignment& assignment() const { return assignment_; }
  // The units this worker keeps in block `layer`, as ranges (checked against `hidden`).
  UnitRanges owned_ranges(int64_t layer, int64_t hidden) const;

 private:
  NeuronAssignment assignment_;
  int worker_;
  std::shared_ptr<const LinearFactory> plain_;  // the single-device layers
};

// A default LayerContext (one device) whose linear factory is worker `worker`'s
// ForwardMaskingLinear.
LayerContext forward_masking_context(NeuronAssignment assignment, int worker);

}  // namespace loom::parallel::sdp
