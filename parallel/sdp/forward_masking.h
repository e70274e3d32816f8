// parallel/sdp/forward_masking.h — SDP's forward masking at the neuron level (docs/parallel.md,
// "SDP"; what it shares with backward masking: parallel/sdp/neuron_masking.h): worker w's
// factory ForwardMaskingLinear packs the blocks' MLPs (and with the heads option their
// attention) to the units w holds, as PackedColumnLinear / PackedRowLinear. The GEMMs, the
// hidden activations, the gradients and hence the optimiser state really shrink: no mask is
// multiplied and nothing is communicated in forward or backward.
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
// init] in parallel/sdp/neuron_masking.h). The slices of the packed attention parameters for
// the sync are head_slices (parallel/sdp/head_slices.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "layers/build_context.h"
#include "parallel/sdp/assignment.h"
#include "parallel/sdp/neuron_masking.h"

namespace loom::parallel::sdp {

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

}  // namespace loom::parallel::sdp
