// layers/block.h — Block: one pre-norm transformer layer, x + attn(norm1(x)) then
// x + mlp(norm2(x)), with dropout on both residual branches (training, config.dropout > 0; the
// masks a function of each element's coordinates, Note [Dropout by coordinates]; with packed
// documents the coordinates are the tokens' indices, Note [Dropout of packed documents] in
// layers/block.cpp) and, by config.recompute, its whole forward recomputed in backward ("full",
// Note [Activation checkpoint] in core/checkpoint.h) or all of it but the results of the ops
// config.recompute_save lists ("selective", Note [Selective recompute] there). With a block
// selection whose residual_scale s ≠ 1 (Note [Block selection] in layers/build_context.h) both
// branches are multiplied by s after their dropout: x + s·attn(norm1(x)), then h + s·mlp(norm2(h)).
//
// Parameter names follow the family: gpt2 ln_1, attn, ln_2, mlp (fc, proj); llama attn_norm,
// attn, mlp_norm, mlp (gate, up, down).
#pragma once

#include <memory>

#include "core/checkpoint.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "layers/attention.h"
#include "layers/dropout_key.h"
#include "layers/mlp.h"
#include "layers/model_config.h"
#include "layers/module.h"
#include "layers/norm.h"

namespace loom {

class Block : public Module {
 public:
  // Attention, MLP and norms are built with ctx (layers/build_context.h); x and the result hold
  // the activation rows of ctx.layout (under sequence parallelism this rank's chunk (B, T/tp, C)).
  // `layer`: the block's index in the model (its dropout streams, Note [Dropout by coordinates]).
  Block(const ModelConfig& config, DType dtype = DType::kF32, Device device = {},
        const LayerContext& ctx = {}, int64_t layer = 0);
  // x (B, T, C); positions (T) integer (global token indices, for RoPE and the dropout masks).
  // dropout is needed only when dropout is active (training and config.dropout > 0). doc_start
  // (T) i32 on the device, or undefined: packed documents for the attention
  // (CausalSelfAttention::forward); a recomputation (activation checkpointing) uses it too.
  Tensor forward(const Tensor& x, const Tensor& positions, const DropoutKey* dropout = nullptr,
                 const Tensor& doc_start = {}) const;
  // Under data parallelism: this replica's micro-batch is batch elements [offset, offset + B)
  // of the single-process micro-batch of `total` elements (data/loader.h): its global batch
  // rows for the dropout masks. total 0: the whole batch.
  struct BatchSlice {
    int64_t offset = 0, total = 0;
  };
  void set_batch_slice(BatchSlice slice) { batch_ = slice; }
  // Input projections ← N(0, std²), residual output projections ← N(0, proj_std²), norms reset.
  void init(Generator& gen, double std, double proj_std);

  const CausalSelfAttention& attn() const { return attn_; }
  // s of Note [Block selection]: 1 unless the context's selection says otherwise.
  double residual_scale() const { return residual_scale_; }

 private:
  // `drop`: whether dropout is active (fixed at forward time, so a recomputation matches).
  Tensor forward_region(const Tensor& x, const Tensor& positions, const Tensor& doc_start,
                        const DropoutKey* key, bool drop) const;
  // rows: the global positions this rank's activations hold (SequenceLayout::dropout_rows, or
  // all positions), undefined for the whole sequence; seq_len: the whole sequence's length.
  Tensor residual_dropout(const Tensor& branch, const Tensor& rows, int64_t seq_len,
                          const DropoutKey& key, int draw) const;

  double dropout_;
  int64_t layer_;
  bool checkpointing_;
  KeptOps kept_;  // what a selective recompute keeps; 0: full (or none)
  double residual_scale_;
  std::shared_ptr<const SequenceLayout> layout_;
  BatchSlice batch_;
  std::unique_ptr<Norm> norm1_;
  CausalSelfAttention attn_;
  std::unique_ptr<Norm> norm2_;
  std::unique_ptr<FeedForward> mlp_;
};

}  // namespace loom
