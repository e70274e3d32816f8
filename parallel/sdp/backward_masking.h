// parallel/sdp/backward_masking.h — SDP's backward masking at the neuron level
// (docs/parallel.md, "SDP"; what it shares with forward masking:
// parallel/sdp/neuron_masking.h): every worker runs the full forward, with weight gradients and
// parameters only for the units it holds; worker w's factory BackwardMaskingLinear splits the
// blocks' MLPs (and with the heads option their attention) into trained and frozen parts
// (BackwardMaskedColumnLinear / BackwardMaskedRowLinear), and frozen_parameters names the frozen
// tensors for the training plan.
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
// (Note [SDP packed init] in parallel/sdp/neuron_masking.h) and splits it, so owned ∪ frozen is
// the single-process weight. A worker holding every unit (coverage 1) has no frozen part: the
// layers are then plain (ops::linear on the whole weight, the GELU MLP fused), the default
// model bit for bit.
//
// Note [SDP backward-masked heads]: the heads option under backward masking. Every worker runs
// the full attention (every head, unscaled); the kv groups it holds of the heads cover (those
// forward masking would keep, Note [SDP packed heads] in parallel/sdp/forward_masking.h) are
// trained, the others frozen:
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
#include "parallel/sdp/neuron_masking.h"

namespace loom::parallel::sdp {

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
