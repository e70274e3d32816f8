// layers/block.cpp — Block (see layers/block.h).
#include "layers/block.h"

#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "core/checkpoint.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"

namespace loom {

namespace {
std::unique_ptr<Norm> make_norm(const ModelConfig& c, DType dtype, Device device,
                                const LayerContext& ctx) {
  if (c.is_llama()) return std::make_unique<RMSNorm>(c.n_embd, c.norm_eps, dtype, device, ctx);
  return std::make_unique<LayerNorm>(c.n_embd, c.norm_eps, true, dtype, device, ctx);
}

std::unique_ptr<FeedForward> make_mlp(const ModelConfig& c, DType dtype, Device device,
                                      const LayerContext& ctx, int64_t layer) {
  if (c.is_llama())
    return std::make_unique<SwiGluMlp>(c.n_embd, c.ffn_hidden_size(), c.has_mlp_bias(), dtype,
                                       device, ctx, layer);
  return std::make_unique<Mlp>(c.n_embd, c.ffn_hidden_size(), true, dtype, device, ctx, layer);
}

// 0…t−1 as i64 on `device`: the coordinates of a row's tokens (Note [Dropout of packed
// documents]).
Tensor token_rows(int64_t t, Device device) {
  std::vector<int64_t> r(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) r[static_cast<size_t>(i)] = i;
  return Tensor::from_vector(r, {t}).to(device);
}
}  // namespace

Block::Block(const ModelConfig& config, DType dtype, Device device, const LayerContext& ctx,
             int64_t layer)
    : dropout_(config.dropout),
      layer_(layer),
      checkpointing_(config.recomputes()),
      kept_(config.recompute == "selective"
                ? parse_kept_ops(config.recompute_save, "model.recompute_save")
                : 0),
      residual_scale_(ctx.blocks ? ctx.blocks->residual_scale : 1.0),
      layout_(ctx.layout),
      norm1_(make_norm(config, dtype, device, ctx)),
      attn_(config, dtype, device, ctx, layer),
      norm2_(make_norm(config, dtype, device, ctx)),
      mlp_(make_mlp(config, dtype, device, ctx, layer)) {
  LOOM_CHECK(std::isfinite(residual_scale_) && residual_scale_ > 0,
             "Block: the block selection's residual_scale must be finite and positive, got ",
             residual_scale_);
  const bool llama = config.is_llama();
  register_module(llama ? "attn_norm" : "ln_1", *norm1_);
  register_module("attn", attn_);
  register_module(llama ? "mlp_norm" : "ln_2", *norm2_);
  register_module("mlp", *mlp_);
}

// Note [Dropout by coordinates]: the whole sequence's element (b0 + b, rows[j], c) of this
// block's stream for `draw`; without a split the plain kernel computes the same indices.
Tensor Block::residual_dropout(const Tensor& branch, const Tensor& rows, int64_t seq_len,
                               const DropoutKey& key, int draw) const {
  const uint64_t stream = dropout_stream(key, layer_, draw);
  if (!rows.defined()) return ops::dropout_at(branch, dropout_, stream, 0, true);
  return ops::dropout_rows_at(branch, dropout_, stream, 0, true, rows, seq_len, batch_.offset);
}

Tensor Block::forward_region(const Tensor& x, const Tensor& positions, const Tensor& doc_start,
                             const DropoutKey* key, bool drop) const {
  // Under sequence/context parallelism x holds some rows of the sequence, under data
  // parallelism some elements of the batch: their global coordinates pick their masks.
  // Note [Dropout of packed documents]: with packed documents the positions restart in every
  // document, so they are not the tokens' coordinates along the row: as rows they would give the
  // documents of a row the same masks at equal positions. The data-parallel rows are then the
  // token indices 0…T−1 (what the plain mask of one process uses); the split layouts' rows come
  // from positions, so they refuse.
  Tensor rows = drop ? layout_->dropout_rows(positions) : Tensor();
  LOOM_CHECK(!rows.defined() || !doc_start.defined(), "Block: dropout (model.dropout ", dropout_,
             ") of packed documents under sequence or context parallelism is not supported: its "
             "rows are positions, which restart in every document");
  if (drop && batch_.total > 0 && !rows.defined())
    rows = doc_start.defined() ? token_rows(positions.size(0), positions.device())
                               : ops::to_dtype(positions.detach(), DType::kI64);
  const int64_t len = layout_->sequence_length(positions.size(0));
  Tensor a = attn_.forward(norm1_->forward(x), positions, doc_start);
  if (drop) a = residual_dropout(a, rows, len, *key, 0);
  if (residual_scale_ != 1.0) a = ops::scale(a, residual_scale_);  // Note [Block selection]
  Tensor h = ops::add(x, a);
  Tensor m = mlp_->forward(norm2_->forward(h));
  if (drop) m = residual_dropout(m, rows, len, *key, 1);
  if (residual_scale_ != 1.0) m = ops::scale(m, residual_scale_);
  return ops::add(h, m);
}

Tensor Block::forward(const Tensor& x, const Tensor& positions, const DropoutKey* dropout,
                      const Tensor& doc_start) const {
  const bool drop = training() && dropout_ > 0.0;
  LOOM_CHECK(!drop || dropout != nullptr, "Block: model.dropout ", dropout_,
             " in training mode needs a dropout key");
  if (!checkpointing_ || !autograd::grad_enabled()) {
    return forward_region(x, positions, doc_start, dropout, drop);
  }
  // The recomputation draws the same masks (they depend on the key and coordinates alone) and
  // keeps the same documents apart.
  const Tensor pos = positions.detach();
  const Tensor docs = doc_start.defined() ? doc_start.detach() : Tensor();
  const DropoutKey key = dropout ? *dropout : DropoutKey{};
  CheckpointFn fn = [this, pos, docs, key, drop](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{forward_region(in[0], pos, docs, &key, drop)};
  };
  return checkpoint(fn, {x}, {}, kept_)[0];
}

void Block::init(Generator& gen, double std, double proj_std) {
  norm1_->reset();
  attn_.init(gen, std, proj_std);
  norm2_->reset();
  mlp_->init(gen, std, proj_std);
}

}  // namespace loom
