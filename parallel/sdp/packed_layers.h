// parallel/sdp/packed_layers.h — SDP's MLP layers at the neuron level (subnetwork data
// parallelism, arXiv 2507.09029; docs/parallel.md, "SDP"): the linear factories of worker w.
// Forward masking (ForwardMaskingLinear): the blocks' MLPs keep only the hidden units w holds
// (parallel/sdp/assignment.h), packed into smaller dense weights; the GEMMs, the hidden
// activations, the gradients and hence the optimiser state really shrink: no mask is multiplied
// and nothing is communicated in forward or backward. Backward masking (BackwardMaskingLinear,
// Note [SDP backward masking layers]): the full forward, with weight gradients and parameters
// only for the owned units. The heads option packs (forward masking, Note [SDP packed heads]) or
// splits (backward masking, Note [SDP backward-masked heads]) each block's attention at the kv
// groups the worker holds of a second cover. Everything else
// (attention without the heads option, embeddings, norms, the head) is built as on one device. This
// file only builds layers: the gradient sync over holder sets is parallel/sdp/slice_sync.h, and
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
// Note [SDP packed heads]: the heads option covers each block's attention with a second cover
// (its own NeuronAssignment, the same N and k, e.g. drawn from seed + 1 so that it differs from
// the MLP cover) whose units are the block's KV groups: under GQA a kv head with its
// g = n_head / n_kv_head query heads, under multi-head attention (g = 1) each head. For block l
// with U = n_kv_head groups of head dim D (Q = U·g·D query rows, K = U·D rows each of k and v)
// and worker w holding groups [u0, u1) (at most two ranges):
//   qkv   PackedColumnLinear over the Q + 2K fused rows (Note [Fused qkv layout]) keeping, per
//         owned range, q rows [u0·g·D, u1·g·D), k rows Q + [u0·D, u1·D) and v rows
//         Q + K + [u0·D, u1·D): ascending, so its output is [q owned, k owned, v owned], each
//         in head order, which is exactly how CausalSelfAttention splits a qkv output of
//         |O|·(g + 2)·D features into |O|·g query and |O| kv heads (Note [Per-block MLP
//         layers] in layers/build_context.h), and query head j of the packed output belongs to
//         kv head ⌊j/g⌋ of it, as in the full model; the bias (GPT-2) the same rows;
//   proj  PackedRowLinear over the owned query heads' Q columns [u0·g·D, u1·g·D), scale
//         1/C = N/k, the bias whole and added once.
// Heads do not interact before proj (each query head attends with its own kv head only), so
// the worker's attention branch is (1/C)·Σ_{owned heads} proj_h(head_h) + b, and the average over
// the N workers is the full attention's output, by Note [SDP packed MLP]'s argument (every
// group held by k workers). At coverage 1 the layers keep every row (as three ranges) and are
// plain: the default attention bit for bit. init draws the full matrices (Note [SDP packed
// init]). The slices of the packed attention parameters for the sync are head_slices
// (parallel/sdp/head_slices.h).
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
//
// Note [SDP backward masking layers]: under backward masking (decision 3 of docs/parallel.md)
// every worker runs the FULL forward, unscaled, so it holds every weight; it forms the weight
// gradient only for the units it owns. BackwardMaskedColumnLinear (mlp_in: fc, gate, up) and
// BackwardMaskedRowLinear (mlp_out: proj, down) split each weight in two dense tensors:
//   owned    the registered parameter ("weight", and the column layer's "bias"): the owned rows
//            (columns), packed, with exactly PackedColumnLinear's (PackedRowLinear's) shape and
//            Placement, so the sync, the optimiser and checkpoints treat it as forward masking's;
//   frozen   the unowned rows (columns), packed in ascending order, requires_grad false and NOT
//            a registered parameter (no gradient, no optimiser state), with its own Placement
//            (split over kAxisSdp, one run per unowned range). Its values are overwritten after
//            every optimiser step by the publication, which this file does not build.
// Column: y = cat(x·W_oᵀ + b_o, x·W_uᵀ + b_u) along the last dim: the hidden units come out
// permuted, owned first, each part ascending. GELU and SwiGLU are elementwise, so the row layer
// reads the same order: y = h[…, :n_o]·W_oᵀ + h[…, n_o:]·W_uᵀ + b (narrow views, no scale; the
// bias whole and replicated, as PackedRowLinear's). The unowned dW GEMMs are skipped, not masked:
// ops::linear forms the gradient of an input only when it requires grad, and the frozen tensors
// do not, while the input gradient flows through every unit. So the worker's loss, logits and
// input gradients are the single-process model's, and its owned gradients are the corresponding
// rows / columns of the single-process gradients. init() draws the full matrix as Linear::init
// (Note [SDP packed init]) and splits it, so owned ∪ frozen is the single-process weight. A
// worker holding every unit (coverage 1) has no frozen part: the layers are then plain
// (ops::linear on the whole weight, the GELU MLP fused), the default model bit for bit.
//
// Note [SDP backward-masked heads]: the heads option under backward masking. Every worker runs
// the full attention (every head, unscaled); the kv groups it holds of the heads cover (those
// forward masking would keep, Note [SDP packed heads]) are trained, the others frozen:
//   qkv   BackwardMaskedColumnLinear over the Q + 2K fused rows with segments {Q, K, K}: the
//         registered weight (and bias) the held groups' q, k and v rows, exactly forward
//         masking's packed qkv (shape and Placement); the frozen tensor the other groups' q, k,
//         v rows, ascending, its runs split at the segments. The output is per segment the held
//         groups' features, then the unheld ones': [q held, q unheld | k held, k unheld | v
//         held, v unheld], all Q + 2K features, so the attention (reading its head counts from
//         out_features(), the full width) splits it into every query and kv head. The groups
//         come out permuted (held first, each part ascending) alike in q, k and v, and a group's
//         g query heads stay adjacent, so query head j still belongs to kv head ⌊j/g⌋: the
//         attention of each head is the full model's, in another head order;
//   proj  BackwardMaskedRowLinear over the Q query columns: registered the held groups' query
//         columns (forward masking's packed proj), frozen the others', reading the heads in the
//         same order (held first); unscaled, the bias whole.
// A sum over heads does not depend on their order, so the worker's attention output, logits and
// loss are the single-process model's (up to the GEMMs' summation order), and its owned
// gradients the corresponding rows / columns of the single-process gradients. The slices of the
// trained and the frozen parts are head_slices' (held = true / false, Note [SDP head slices]).
//
// Note [SDP frozen parameters]: the training plan must find every frozen tensor under its GLOBAL
// name (the owned part's: "blocks.3.mlp.fc.weight"; the two are pieces of one global tensor,
// told apart by their placements). The name exists only in the model (named_parameters), the
// frozen tensor only in its layer, so frozen_parameters pairs each layer's owned tensor with its
// frozen one and finds the owned tensor among the named parameters by handle identity (the same
// TensorImpl: register_parameter returns the handle it registers). Two ways to get the pairs, one
// matching rule (match_frozen):
//   frozen_parameters(model)                 walks the model's modules (for_each_module) for the
//                                            backward-masked layers: needs nothing but the model;
//   frozen_parameters(factory, named_params) reads the factory's record of the layers it built:
//                                            for a caller holding the factory and the parameter
//                                            list (the plan), whatever module tree they came from.
// The record keeps weak references only (nothing outlives its layer; a layer gone, or built for
// another model from the same factory, matches no named parameter and is skipped), behind a
// mutex: building is the only writer. It is the factory's one piece of mutable state, invisible
// to the layers and to any other factory. Both return the pairs in named_parameters() order (the
// same on every worker), the weight before the bias of a layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
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

// What the two neuron-level factories (forward and backward masking) share: worker `worker` of
// `assignment` (checked at construction), every layer but mlp_in / mlp_out the single-device
// one, and the units the worker holds per block. `what` names the factory in errors.
class NeuronMaskingLinear : public LinearFactory {
 public:
  int feature_split() const override { return 1; }
  std::unique_ptr<LinearLayer> column(int64_t in, const std::vector<int64_t>& segments, bool bias,
                                      DType dtype, Device device) const override;
  std::unique_ptr<LinearLayer> row(int64_t in, int64_t out, bool bias, DType dtype,
                                   Device device) const override;
  std::unique_ptr<EmbeddingLayer> vocab_embedding(int64_t rows, int64_t dim, DType dtype,
                                                  Device device) const override;
  Tensor replicated_param(const Tensor& p) const override { return p; }
  Tensor column_input(const Tensor& x) const override { return x; }

  int worker() const { return worker_; }
  const NeuronAssignment& assignment() const { return assignment_; }
  // The units this worker holds (forward masking: keeps; backward masking: trains) in block
  // `layer`, as ranges (checked against `hidden`).
  UnitRanges owned_ranges(int64_t layer, int64_t hidden) const;
  // The heads cover, or null without the heads option.
  const NeuronAssignment* heads() const { return heads_ ? &*heads_ : nullptr; }

 protected:
  // `heads` (optional) must have the same workers and replication as `assignment`.
  NeuronMaskingLinear(NeuronAssignment assignment, int worker, const char* what,
                      std::optional<NeuronAssignment> heads = {});
  // With the heads option: the fused qkv rows (segments {q, k, v}, k = v dividing q) of the kv
  // groups this worker holds in block `layer` of the heads cover, q rows, then k, then v rows,
  // each ascending (Note [SDP packed heads]); and the proj columns (`in` = q) of their query
  // heads. Errors name the block and the sizes.
  UnitRanges head_rows(int64_t layer, const std::vector<int64_t>& segments) const;
  UnitRanges head_columns(int64_t layer, int64_t in) const;

 private:
  // Layer `layer` of the heads cover (checked to be one of its layers).
  const LayerCover& head_cover(int64_t layer) const;

  NeuronAssignment assignment_;
  int worker_;
  const char* what_;
  std::shared_ptr<const LinearFactory> plain_;  // the single-device layers
  std::optional<NeuronAssignment> heads_;
};

// Worker `worker`'s factory under forward masking (Note [SDP packed MLP]): mlp_in / mlp_out of
// block l are packed to the units the worker holds in layer l of `assignment` (whose layers are
// the model's blocks, in order, each covering the block's ffn hidden units). With `heads` (the
// heads option, Note [SDP packed heads]: a cover of each block's kv groups, the same workers and
// replication as `assignment`) attn_in / attn_out of block l are packed to the kv groups the
// worker holds in layer l of it; without, the attention is the single-device one. Every other
// layer is the single-device one. The row layers scale by N / k. Errors name the block and the
// sizes when a block is outside a cover or its hidden size (kv head count) differs from the
// cover's.
class ForwardMaskingLinear final : public NeuronMaskingLinear {
 public:
  ForwardMaskingLinear(NeuronAssignment assignment, int worker,
                       std::optional<NeuronAssignment> heads = {});
  std::unique_ptr<LinearLayer> mlp_in(int64_t layer, int64_t in, int64_t hidden, bool bias,
                                      DType dtype, Device device) const override;
  std::unique_ptr<LinearLayer> mlp_out(int64_t layer, int64_t hidden, int64_t out, bool bias,
                                       DType dtype, Device device) const override;
  // segments {q, k, v} (q = g·k): the owned kv groups' q, k and v rows.
  std::unique_ptr<LinearLayer> attn_in(int64_t layer, int64_t in,
                                       const std::vector<int64_t>& segments, bool bias, DType dtype,
                                       Device device) const override;
  // in = q: the owned query heads' columns, scaled by N / k.
  std::unique_ptr<LinearLayer> attn_out(int64_t layer, int64_t in, int64_t out, bool bias,
                                        DType dtype, Device device) const override;

  // 1/C = N / k: the row layers' scale.
  double scale() const;
};

// A default LayerContext (one device) whose linear factory is worker `worker`'s
// ForwardMaskingLinear (with the heads cover `heads`, if given).
LayerContext forward_masking_context(NeuronAssignment assignment, int worker,
                                     std::optional<NeuronAssignment> heads = {});

// What the backward-masked layers share (Note [SDP backward masking layers]): the owned units
// (the registered parameters'), the unowned ones (the frozen tensors'), the registered weight and
// bias, and the frozen tensors.
class BackwardMaskedLinear : public LinearLayer {
 public:
  const Tensor& weight() const override { return weight_; }
  const Tensor& bias() const override { return bias_; }
  const UnitRanges& owned_ranges() const { return owned_; }
  // The units not owned, ascending, split at the segments' boundaries; empty at coverage 1.
  const UnitRanges& unowned_ranges() const { return unowned_; }
  // The unowned rows (column layer) or columns (row layer), requires_grad false; undefined when
  // every unit is owned.
  const Tensor& frozen_weight() const { return frozen_weight_; }
  // The column layer's unowned bias rows; undefined without bias, at coverage 1 and for the row
  // layer (whose bias is whole).
  const Tensor& frozen_bias() const { return frozen_bias_; }
  bool plain() const override { return unowned_.empty(); }

 protected:
  // `segments` (sizes summing to `units`; empty: one segment of all the units) split the units
  // as a column layer's out features (Note [SDP backward-masked heads]).
  BackwardMaskedLinear(int64_t units, UnitRanges owned, const char* what,
                       std::vector<int64_t> segments = {});
  int64_t owned_count() const;

  int64_t units_;
  UnitRanges owned_, unowned_;
  // Per segment: how many of its units are owned, and how many not.
  std::vector<int64_t> owned_per_segment_, unowned_per_segment_;
  Tensor weight_, bias_;
  Tensor frozen_weight_, frozen_bias_;
};

// mlp_in (and attn_in with heads) under backward masking: "weight" (owned, in) and "bias"
// (owned) as PackedColumnLinear's [sdp-packed dim 0]; frozen (units − owned, in) and bias rows
// [sdp-packed dim 0, the unowned runs]. forward: x (…, in) → (…, units), within each segment
// the owned units first (one segment: the MLP's layout; {q, k, v}: Note [SDP backward-masked
// heads]).
class BackwardMaskedColumnLinear final : public BackwardMaskedLinear {
 public:
  // `units` the full layer's out features, `owned` the rows this worker trains (non-empty,
  // ascending, disjoint, within [0, units)); the other rows are frozen. `segments` as
  // BackwardMaskedLinear's.
  BackwardMaskedColumnLinear(int64_t in_features, int64_t units, UnitRanges owned, bool bias,
                             DType dtype = DType::kF32, Device device = {},
                             std::vector<int64_t> segments = {});
  Tensor forward(const Tensor& x) const override;
  void init(Generator& gen, double std) override;  // the full matrix, split
  void zero_rows_from(int64_t global_row) override;
  int64_t out_features() const override { return units_; }  // every unit, owned or frozen
  int64_t in_features() const override { return in_features_; }

 private:
  int64_t in_features_;
};

// mlp_out under backward masking: "weight" (out, owned) as PackedRowLinear's [sdp-packed dim 1],
// "bias" (out) whole; frozen (out, units − owned) [sdp-packed dim 1, the unowned runs].
// forward: h (…, units) in the column layer's order (owned first) → (…, out), unscaled.
class BackwardMaskedRowLinear final : public BackwardMaskedLinear {
 public:
  BackwardMaskedRowLinear(int64_t units, int64_t out_features, UnitRanges owned, bool bias,
                          DType dtype = DType::kF32, Device device = {});
  Tensor forward(const Tensor& x) const override;
  void init(Generator& gen, double std) override;
  void zero_rows_from(int64_t global_row) override;
  int64_t out_features() const override { return out_features_; }
  int64_t in_features() const override { return units_; }  // every unit, owned or frozen

 private:
  int64_t out_features_;
};

// Worker `worker`'s factory under backward masking (Note [SDP backward masking layers]): mlp_in /
// mlp_out of block l are split at the units the worker holds in layer l of `assignment`; with
// `heads` (the heads option, Note [SDP backward-masked heads]) attn_in / attn_out of block l are
// split at the kv groups the worker holds in layer l of it; every other layer is the
// single-device one. Errors as ForwardMaskingLinear's.
class BackwardMaskingLinear final : public NeuronMaskingLinear {
 public:
  BackwardMaskingLinear(NeuronAssignment assignment, int worker,
                        std::optional<NeuronAssignment> heads = {});
  std::unique_ptr<LinearLayer> mlp_in(int64_t layer, int64_t in, int64_t hidden, bool bias,
                                      DType dtype, Device device) const override;
  std::unique_ptr<LinearLayer> mlp_out(int64_t layer, int64_t hidden, int64_t out, bool bias,
                                       DType dtype, Device device) const override;
  // segments {q, k, v}: the held kv groups' q, k and v rows trained, the others frozen; the
  // output every group's, held groups first within q, k and v.
  std::unique_ptr<LinearLayer> attn_in(int64_t layer, int64_t in,
                                       const std::vector<int64_t>& segments, bool bias, DType dtype,
                                       Device device) const override;
  // in = q: the held query heads' columns trained, the others frozen; unscaled.
  std::unique_ptr<LinearLayer> attn_out(int64_t layer, int64_t in, int64_t out, bool bias,
                                        DType dtype, Device device) const override;

  // (owned, frozen) of each split tensor of the layers built so far that are still alive, in
  // building order (Note [SDP frozen parameters]).
  std::vector<std::pair<Tensor, Tensor>> built_pairs() const;

 private:
  struct Record;  // the layers built: weak references (Note [SDP frozen parameters])
  void record(const BackwardMaskedLinear& layer) const;

  std::shared_ptr<Record> built_;
};

// A default LayerContext (one device) whose linear factory is worker `worker`'s
// BackwardMaskingLinear (with the heads cover `heads`, if given).
LayerContext backward_masking_context(NeuronAssignment assignment, int worker,
                                      std::optional<NeuronAssignment> heads = {});

// Every frozen tensor of `model` with its global parameter name, in named_parameters() order
// (Note [SDP frozen parameters]): for each backward-masked layer with a frozen part, (name of its
// "weight", frozen_weight()) and, with a bias, (name of its column layer's "bias",
// frozen_bias()). Each carries its Placement (the unowned runs). Empty for a model with no
// backward-masked layer or at coverage 1. An error names the shape of an owned tensor that is not
// among the model's parameters.
std::vector<std::pair<std::string, Tensor>> frozen_parameters(const Module& model);
// The same from the layers `factory` built whose owned tensors are among `named_params` (a
// model's named_parameters()), in that list's order; the layers of other models are skipped.
std::vector<std::pair<std::string, Tensor>> frozen_parameters(
    const BackwardMaskingLinear& factory,
    const std::vector<std::pair<std::string, Tensor>>& named_params);

}  // namespace loom::parallel::sdp
