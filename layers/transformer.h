// layers/transformer.h — Transformer: the decoder-only language model for both families, built
// from a ModelConfig; plus validate() (config errors naming the key) and count_parameters().
//
//  gpt2:  wte (Vp, C), wpe (max_seq_len, C), blocks.{i} (LayerNorm, GELU MLP, biases), ln_f;
//         the head reuses wte.weight (tied) unless tie_embeddings is false (then lm_head).
//  llama: wte (Vp, C), blocks.{i} (RMSNorm, RoPE(theta), GQA, SwiGLU, no biases), norm_f, and
//         lm_head (Vp, C) unless tie_embeddings.
// Vp = config.padded_vocab(); rows [V, Vp) of the tables are padding: zero at init, and the
// loss leaves their logits out (so they get no gradient from it).
//
// Note [Model FLOPs]: flops_per_token(T) = 6·N + 12·n_layer·n_embd·T (PaLM appendix B, as in
// Megatron and llm.c): 6·N for the forward and backward matmuls against the N parameters a token
// multiplies, plus 12·L·C·T for the attention scores and weighted sums (QKᵀ and P·V, forward
// 4·L·C·T counted over the full T×T square, i.e. not halved for causality, times 3 for
// backward). N is every parameter except lookup-only tables: wpe, and wte when the head is
// untied (a tied wte counts once, as the head). Padding rows are counted: the GEMMs do them.
// It is the whole model's, computed from the config: a tensor-parallel rank holding part of the
// weights reports the same figure as one process (and an SDP worker holding some blocks, Note
// [Block selection] in layers/build_context.h, the full model's too).
//
// Note [Selected blocks]: built with a LayerContext whose `blocks` selection holds only some
// blocks, the model builds those alone, registered under their global names "blocks.<i>"; block
// indices everywhere in this class are global: num_blocks() is n_layer, run_blocks(x, pos,
// begin, end) runs the held blocks with index in [begin, end) in order and passes x through the
// others unchanged (the residual path), block(i) is held block i (an error for one not held).
// init_weights() gives every held block and everything after the blocks exactly the values the
// full model's init gives them from the same generator: each block not held advances the
// generator by what a block's init draws (measured by initialising the first held block from a
// scratch generator: every block draws the same full shapes), so the draws stay aligned.
//
// Note [Parameter units]: parameter_units() lists unit 0 (wte, wpe), unit 1 + i for block i
// (i in [0, n_layer)), and unit n_layer + 1 (the final norm and an untied head); every parameter
// is in exactly one unit, in named_parameters() order, and the forward brackets each unit it runs
// with the hooks (the tied head enters unit 0 again). With a selection a block not held has an
// empty unit (the numbering stays global), and set_unit_hooks refuses: ZeRO-3 over a subnetwork
// would shard a different parameter set on every rank, which nothing designs yet.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "layers/block.h"
#include "layers/embedding.h"
#include "layers/linear.h"
#include "layers/model_config.h"
#include "layers/module.h"
#include "layers/norm.h"
#include "layers/unit_hooks.h"

namespace loom {

// Throws loom::Error naming the offending key, e.g.
// "model.n_embd: 100 is not divisible by model.n_head 3".
void validate(const ModelConfig& config);

// Parameters of the model `config` describes, computed without building it. With
// exclude_padding the tables count vocab_size rows instead of padded_vocab() (the published
// GPT-2 sizes, e.g. 124,439,808 for gpt2-124M, are of this kind).
int64_t count_parameters(const ModelConfig& config, bool exclude_padding = false);
// The FLOPs of one token of a T-token sequence, forward and backward (Note [Model FLOPs]).
double model_flops_per_token(const ModelConfig& config, int64_t T);

class Transformer : public Module {
 public:
  // Validates config; parameters start zero (norm weights one) until init_weights().
  // Every layer is built with ctx (layers/build_context.h): with the mesh's capabilities this
  // rank holds its part of every layer (vocab-parallel wte and head, parallel attention and
  // MLP). The model keeps the capabilities it uses; what they refer to must outlive it.
  explicit Transformer(const ModelConfig& config, DType dtype = DType::kF32, Device device = {},
                       const LayerContext& ctx = {});

  // Weights ← N(0, init_std²); residual output projections (attn.proj, mlp.proj / mlp.down)
  // ← N(0, (init_std/√(2·n_layer))²); biases ← 0; norm weights ← 1; padded vocab rows ← 0.
  // Draws in named_parameters() order.
  void init_weights(Generator& gen);

  // ids (B, T) integer, T ≤ max_seq_len → logits (B, T, Vp) on the model's device, in the compute
  // dtype (Note [Compute dtype] in layers/module.h). Positions are arange(T). ids may be on the
  // host: they are copied to the model's device.
  Tensor forward(const Tensor& ids, const DropoutKey* dropout = nullptr) const;
  // The same with explicit global positions (T) integer (context parallel passes its slice).
  Tensor forward(const Tensor& ids, const Tensor& positions, const DropoutKey* dropout) const;
  // Mean softmax cross-entropy over the real vocabulary; targets (B, T), -100 = ignored. The
  // loss is f32 for 16-bit compute dtypes (computed inside the fused op), on the model's device.
  // Host ids/targets are copied to the device; host targets are also counted where they are, so
  // a device step reads nothing back (Note [Cross-entropy count] in core/ops/cross_entropy.cpp).
  // The loss is the context's LossFn of the logits (B, T, Vp), or (B, T, Vp/tp) when split.
  Tensor loss(const Tensor& ids, const Tensor& targets, const DropoutKey* dropout = nullptr) const;
  Tensor loss(const Tensor& ids, const Tensor& targets, const Tensor& positions,
              const DropoutKey* dropout) const;

  // Packed documents (SFT packing; Note [Packed documents] in kernels/attention.h): each row of
  // ids holds several documents, positions (T) restart at 0 for each (so wpe and RoPE see
  // per-document positions) and doc_start (T) i32 gives each token's document start, shared by
  // every batch row: attention never crosses a document. The caller sets the targets that would
  // cross a boundary to -100. doc_start may be on the host, as ids and positions: checked there
  // (doc_start[0] = 0, doc_start[i] ∈ {doc_start[i−1], i}) and uploaded once per call (Note
  // [Host ids]). Undefined: the overloads above. Under context parallelism ids and positions
  // are this rank's part and doc_start the whole sequence's, which Ulysses attention takes and
  // ring attention refuses (parallel/cp).
  Tensor forward(const Tensor& ids, const Tensor& positions, const DropoutKey* dropout,
                 const Tensor& doc_start) const;
  Tensor loss(const Tensor& ids, const Tensor& targets, const Tensor& positions,
              const DropoutKey* dropout, const Tensor& doc_start) const;

  // The pieces forward() and loss() are made of, for pipeline stages (parallel/pp) that run a
  // slice of the model: forward(ids, pos) = head_logits(run_blocks(embed(ids, pos), pos, 0,
  // n_layer)), and loss() = head_loss(…) on the same activation, with identical results.
  Tensor positions(int64_t T) const;        // arange(T), i32, on the model's device
  static Tensor host_positions(int64_t T);  // the same on the host
  // ids (B, T) → x (B, T, C): token (+ learned position) embeddings. ids and positions may be
  // on the host (checked there and uploaded: Note [Host ids] in layers/transformer.cpp).
  Tensor embed(const Tensor& ids, const Tensor& positions) const;
  // x (B, T, C) through blocks [begin, end) → (B, T, C) (the held ones: Note [Selected
  // blocks]). doc_start: packed documents, or undefined; on the host it is uploaded once here
  // (check it first: forward() and loss() do), with model.sliding_window's window applied (Note
  // [Sliding window] in layers/transformer.cpp; a device doc_start is read back for it).
  Tensor run_blocks(Tensor x, const Tensor& positions, int64_t begin, int64_t end,
                    const DropoutKey* dropout, const Tensor& doc_start = {}) const;
  // x (B, T, C) → final norm → logits (B, T, Vp).
  Tensor head_logits(const Tensor& x) const;
  // x (B, T, C) → mean cross-entropy against targets (B, T) over the real vocabulary.
  Tensor head_loss(const Tensor& x, const Tensor& targets) const;

  using Module::num_parameters;
  // With exclude_padding, the padded vocab rows of wte (and of an untied lm_head) are left out.
  int64_t num_parameters(bool exclude_padding) const;
  // Model FLOPs per token for forward + backward at sequence length T, the whole model's
  // whatever this rank holds (Note [Model FLOPs]).
  double flops_per_token(int64_t T) const;

  // Note [Parameter units]. Hooks are not owned and must outlive every forward that uses them
  // (null: none); refused when some block is not held.
  std::vector<std::vector<std::pair<std::string, Tensor>>> parameter_units() const;
  void set_unit_hooks(UnitHooks* hooks);

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  // The model's blocks, n_layer, held or not (Note [Selected blocks]).
  int64_t num_blocks() const { return config_.n_layer; }
  // The blocks this rank built, ascending global indices (all of them without a selection).
  const std::vector<int64_t>& held_blocks() const { return held_; }
  bool holds_block(int64_t i) const;
  // Every held block's Block::set_batch_slice (data parallelism's dropout masks).
  void set_batch_slice(Block::BatchSlice slice) {
    for (auto& b : blocks_) b->set_batch_slice(slice);
  }
  // Block i (global index); an error naming it when this rank does not hold it.
  const Block& block(int64_t i) const;
  const Tensor& wte_weight() const { return wte_->weight(); }
  // The (Vp, C) matrix the logits are computed against: wte.weight when tied, else lm_head.weight.
  const Tensor& head_weight() const;

 private:
  void record_roles();  // Note [Parameter roles] in layers/transformer.cpp
  // ZeRO-3 hooks around each parameter unit (layers/unit_hooks.h); no-ops without hooks.
  void enter(int unit) const;
  Tensor leave(int unit, const Tensor& out) const;
  // Each row's first key for the attention (Note [Sliding window] in layers/transformer.cpp):
  // doc_start with the window applied, on the model's device; undefined without either.
  Tensor first_keys(const Tensor& doc_start, const Tensor& pos) const;

  ModelConfig config_;
  DType dtype_;
  Device device_;
  std::shared_ptr<const LinearFactory> linear_;  // replicated_param (wpe), column_input (head)
  LossFn loss_;
  std::shared_ptr<const SequenceLayout> layout_;
  std::unique_ptr<EmbeddingLayer> wte_;
  std::unique_ptr<Embedding> wpe_;              // gpt2 only
  std::vector<std::unique_ptr<Block>> blocks_;  // the held blocks, in held_ order
  std::vector<int64_t> held_;                   // their global indices, ascending
  std::vector<int64_t> slot_;                   // per global index: its place in blocks_, or -1
  std::unique_ptr<Norm> norm_f_;
  std::unique_ptr<LinearLayer> lm_head_;  // untied only; its weight is used, not its forward
  UnitHooks* hooks_ = nullptr;
};

}  // namespace loom
