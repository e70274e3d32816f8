// layers/build_context.h — LayerContext: the capabilities a model is built with, so that a
// parallel scheme splits one model over ranks without any layer seeing a scheme or a
// communicator (DESIGN §5.10). Four capabilities, each replaceable alone, and a block selection:
//   linear     LinearFactory: the model's linear and embedding layers (column-parallel with
//              segments, row-parallel, vocab table) and the two ops that enter and leave the
//              activation layout those layers produce (replicated_param, column_input);
//   attention  AttentionFn: causal attention of this rank's q, k, v (packed documents kept
//              apart by doc_start);
//   loss       LossFn: the language-model loss of this rank's logits;
//   layout     SequenceLayout: which tokens of each sequence this rank holds and the global
//              coordinates of its tokens and activation rows (positions, dropout rows, the
//              whole sequence's length);
//   blocks     BlockSelection: which transformer blocks this rank builds, their residual
//              scale, which of them are frozen (Note [Block selection]).
// A default-constructed LayerContext is one device (Linear, Embedding, ops::causal_attention,
// ops::softmax_cross_entropy, the whole sequence). parallel/mesh_layers.h builds the mesh one
// (tensor, sequence and context parallelism); a new scheme replaces one member (SDP the linear
// factory, Ulysses the attention function) and touches no layer.
//
// Note [Sequence-parallel region ops]: under sequence parallelism the activations between the
// linear layers are chunks of the sequence, produced by the factory's own layers (the vocab
// embedding and the row layer reduce-scatter; the column layer all-gathers its input). The two
// differentiable ops that match that split belong to the same factory: replicated_param (a
// parameter every rank holds whole, used on this rank's chunk: its gradient summed over the
// group, as the row layer does for its own bias) and column_input (an activation as the input
// of a column-parallel matmul against a weight used directly, the tied LM head: all-gathered
// along the sequence, or without sequence parallelism the copy whose gradient is all-reduced,
// a tensor-parallel op that no sequence layout could own). The SequenceLayout keeps only
// coordinates (non-differentiable index tensors and lengths), so attention schemes and the
// loss never depend on how the linear layers split activations.
//
// Note [Per-block MLP layers]: the MLP's layers come from mlp_in / mlp_out, which carry the
// block's index, rather than from column / row: a scheme that splits each block's hidden units
// differently (SDP's forward masking keeps worker w's units of block l, parallel/sdp/
// forward_masking.h) needs to know which block it builds for, and counting calls in construction
// order would tie the factory to one model's build order. The attention's two layers come the
// same way from attn_in (the fused qkv column layer, segments {q, k, v}) and attn_out (proj),
// so a scheme may keep different heads per block (SDP's heads option, Note [SDP packed heads]).
// The attention then reads how many heads this rank computes from the built qkv layer: with
// g = n_head / n_kv_head query heads per kv head and head dim D, a qkv layer of `out` local
// output features (LinearLayer::out_features) computes out / ((g + 2)·D) kv heads and g times as
// many query heads, in Note [Fused qkv layout]'s order restricted to them (q rows, then k, then v);
// for the column split of tensor parallelism that is n_head / feature_split() and kv_heads /
// feature_split(), as before. Factories that split every layer alike (one device, tensor
// parallelism) keep the defaults (column / row).
//
// Note [Block selection]: a scheme may build a model of which this rank holds only some of the
// transformer blocks (SDP at the block level: worker w trains C·n_layer of them, parallel/sdp/
// block_level.h). LayerContext::blocks (null: every block, unscaled, trained) says
//   held            the blocks built, ascending global indices in [0, n_layer) (empty: all). A
//                   block not held has no parameters on this rank and its forward is the
//                   identity: the activation goes on through the residual path. The held blocks
//                   keep their global names ("blocks.<i>", so parameter names, checkpoints and
//                   the dropout streams are the full model's), and Transformer::init_weights
//                   draws each held block's values exactly as the full model does (the generator
//                   advances over the blocks not held);
//   residual_scale  s: every built block computes x + s·attn(norm1(x)) then h + s·mlp(norm2(h))
//                   (s after the branch's dropout; the drop-path convention, applied in training
//                   and evaluation alike: it is part of the subnetwork's function, as the packed
//                   MLP's 1/C is; the full model is built without a selection). s = 1 adds no
//                   op, so the model is the default one bit for bit;
//   frozen          built blocks whose parameters do not require grad (ascending, a subset of
//                   the held blocks): their input gradient still flows, their weight gradients
//                   are never formed (backward masking, whose frozen values arrive from the
//                   blocks' holders).
// The Transformer checks the selection (ascending, in range, s finite and positive) and refuses
// ZeRO-3 unit hooks when some block is not held (Note [Parameter units] in layers/transformer.h).
//
// LinearLayer / EmbeddingLayer are what the model holds: layers/linear.h and layers/embedding.h
// are the single-device ones, parallel/tp/layers.h the sharded ones. Their init() draws the
// FULL tensor exactly as the single-device layer would (same generator calls) and keeps this
// rank's part, so a sharded model starts as a slice of the single-device one.
//
// Ownership: layers copy the capabilities they use (shared_ptrs, functions), so a model keeps
// them alive; whatever a capability refers to (a ParallelContext's communicators) must outlive
// the model and every graph built from it. Nothing here is mutable state: the single-device
// capabilities are const objects.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "layers/module.h"

namespace loom {

// y = x·Wᵀ + b over some split of W (out, in).
class LinearLayer : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;
  // W ← N(0, std²) drawn as the full (out, in) matrix, b ← 0.
  virtual void init(Generator& gen, double std) = 0;
  virtual const Tensor& weight() const = 0;  // this rank's part
  virtual const Tensor& bias() const = 0;    // undefined without bias
  // Rows [global_row, out) of W ← 0 (the padded vocabulary rows of an LM head).
  virtual void zero_rows_from(int64_t global_row) = 0;
  // Whether forward() is exactly ops::linear(x, compute(weight()), compute(bias())) with no
  // communication or masking, so a caller may fuse it with its neighbours (the GELU MLP).
  virtual bool plain() const { return false; }
  // The features this rank's layer outputs (takes): the rows (columns) of its weight, unless
  // a layer computes with more than its registered weight (SDP's backward-masked layers also
  // multiply by a frozen part, parallel/sdp/backward_masking.h), which overrides them. The
  // attention reads its local head counts from these (Note [Per-block MLP layers]).
  virtual int64_t out_features() const { return weight().size(0); }
  virtual int64_t in_features() const { return weight().size(1); }
};

// A (rows, dim) lookup table over some split of its rows.
class EmbeddingLayer : public Module {
 public:
  virtual Tensor forward(const Tensor& ids) const = 0;  // ids (…) → (…, dim)
  // W ← N(0, std²) drawn as the full table; then global rows [zero_from, rows) ← 0.
  virtual void init(Generator& gen, double std, int64_t zero_from) = 0;
  virtual const Tensor& weight() const = 0;  // this rank's rows
};

// The model's linear and embedding layers, and the region ops of their activation layout
// (Note [Sequence-parallel region ops]).
class LinearFactory {
 public:
  virtual ~LinearFactory() = default;
  // How many parts column layers split each segment's features into (and row layers their
  // input features): heads and hidden sizes must divide by it. 1 on one device.
  virtual int feature_split() const = 0;
  // Column layer: the out features come in `segments` (e.g. {q, k, v} rows), each split in
  // feature_split() parts; the output holds this rank's part of each, in segment order.
  virtual std::unique_ptr<LinearLayer> column(int64_t in, const std::vector<int64_t>& segments,
                                              bool bias, DType dtype, Device device) const = 0;
  // Row layer: in features split; the output in the layout between layers (complete, or this
  // rank's sequence chunk under sequence parallelism).
  virtual std::unique_ptr<LinearLayer> row(int64_t in, int64_t out, bool bias, DType dtype,
                                           Device device) const = 0;
  // The MLP of block `layer` (Note [Per-block MLP layers]): an input projection (fc, gate, up:
  // in → hidden, a column layer) and the output projection (proj, down: hidden → out, a row
  // layer). By default column(in, {hidden}, …) and row(hidden, out, …).
  virtual std::unique_ptr<LinearLayer> mlp_in(int64_t layer, int64_t in, int64_t hidden, bool bias,
                                              DType dtype, Device device) const;
  virtual std::unique_ptr<LinearLayer> mlp_out(int64_t layer, int64_t hidden, int64_t out,
                                               bool bias, DType dtype, Device device) const;
  // The attention of block `layer` (Note [Per-block MLP layers]): the fused qkv projection
  // (in → segments {q, k, v}, a column layer; its local output features must be whole kv
  // groups of q, k and v rows, in that order) and the output projection (proj: in → out, a row
  // layer over the query heads the qkv layer computes). By default column(in, segments, …) and
  // row(in, out, …).
  virtual std::unique_ptr<LinearLayer> attn_in(int64_t layer, int64_t in,
                                               const std::vector<int64_t>& segments, bool bias,
                                               DType dtype, Device device) const;
  virtual std::unique_ptr<LinearLayer> attn_out(int64_t layer, int64_t in, int64_t out, bool bias,
                                                DType dtype, Device device) const;
  // Vocab table (rows split); output as a row layer's.
  virtual std::unique_ptr<EmbeddingLayer> vocab_embedding(int64_t rows, int64_t dim, DType dtype,
                                                          Device device) const = 0;
  // A parameter every rank holds whole, as used on this rank's activations (norm weights and
  // biases, wpe): identity forward; its gradient arrives complete (Note [Sequence-parallel
  // region ops]).
  virtual Tensor replicated_param(const Tensor& p) const = 0;
  // A parameter every rank holds whole but applies to this rank's attention heads only (Qwen3's
  // per-head q/k norm weights): identity forward; its gradient, a sum over the heads, is summed
  // over the ranks that split the heads.
  virtual Tensor head_param(const Tensor& p) const = 0;
  // An activation x (B, R, C) as the input of a matmul against this rank's column part of a
  // weight used directly (the LM head, whose weight may be the tied table).
  virtual Tensor column_input(const Tensor& x) const = 0;
};

// Where this rank's tokens and activation rows sit in the single process's sequence. The
// positions passed in are the global indices (T) of the tokens this rank's input holds (its
// context-parallel part, or arange(T)); the activations between layers hold rows of them.
class SequenceLayout {
 public:
  virtual ~SequenceLayout() = default;
  // The tokens this rank's input holds of whole sequences x (…, T, …) along `dim` (its
  // context-parallel part, or x itself): how the step runners cut token ids and targets. Not
  // differentiable.
  virtual Tensor local_sequence(const Tensor& x, int64_t dim) const = 0;
  // The global positions (T') of those tokens in a sequence of `sequence_length`, i32 on the
  // host, or an undefined tensor on one device (the model's own arange, Note [Host ids] in
  // layers/transformer.cpp).
  virtual Tensor local_positions(int64_t sequence_length) const = 0;
  // The global positions of the activation rows this rank holds, in the dtype and on the
  // device of `positions` (not differentiable): the positions themselves, or a part of them.
  virtual Tensor row_positions(const Tensor& positions) const = 0;
  // The same as global row indices (R) i64 for the rows form of dropout (Note [Dropout by
  // coordinates]), or an undefined tensor when the rows are the whole sequence in order (the
  // plain mask applies).
  virtual Tensor dropout_rows(const Tensor& positions) const = 0;
  // The whole sequence's length, given the number of tokens this rank's input holds.
  virtual int64_t sequence_length(int64_t local_tokens) const = 0;
  // The number of tokens this rank's input holds, given the activation rows it holds.
  virtual int64_t local_tokens(int64_t rows) const = 0;
};

// q (B, Hq, T, D), k, v (B, Hkv, T, D), this rank's heads and tokens → y (B, Hq, T, D): causal
// by global position. doc_start (T) i32 on q's device, or undefined: packed documents, row i
// attending only to doc_start[i] ≤ j ≤ i (Note [Packed documents] in kernels/attention.h); a
// scheme that cannot keep documents apart refuses a defined one.
using AttentionFn = std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& doc_start)>;
// logits (B, R, Vp or a part of it), targets (B, T) → the loss whose backward is this rank's
// share of the mean cross-entropy over the real vocabulary (vocab_size), ignore_index left out.
using LossFn = std::function<Tensor(const Tensor& logits, const Tensor& targets,
                                    int64_t ignore_index, int64_t vocab_size)>;

// The single-device capabilities (const, shared by every default context).
std::shared_ptr<const LinearFactory> single_device_linear();
std::shared_ptr<const SequenceLayout> single_device_layout();
Tensor single_device_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& doc_start);
// Host targets are counted where they are, so a device step reads nothing back.
Tensor single_device_loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                          int64_t vocab_size);

// Which blocks a model builds, how their residual branches are scaled, which are frozen (Note
// [Block selection]).
struct BlockSelection {
  std::vector<int64_t> held;    // ascending global block indices; empty: every block
  double residual_scale = 1.0;  // s, on both residual branches of every built block
  std::vector<int64_t> frozen;  // ascending, held: parameters with requires_grad false
};

struct LayerContext {
  std::shared_ptr<const LinearFactory> linear = single_device_linear();
  AttentionFn attention = single_device_attention;
  LossFn loss = single_device_loss;
  std::shared_ptr<const SequenceLayout> layout = single_device_layout();
  std::shared_ptr<const BlockSelection> blocks;  // null: every block (Note [Block selection])
};

}  // namespace loom
