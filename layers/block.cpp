// layers/block.cpp — Block (see layers/block.h).
#include "layers/block.h"

#include "core/autograd.h"
#include "core/checkpoint.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"

namespace loom {

namespace {
std::unique_ptr<Norm> make_norm(const ModelConfig& c, DType dtype, Device device,
                                const ModelParallel* mp) {
  if (c.is_llama()) return std::make_unique<RMSNorm>(c.n_embd, c.norm_eps, dtype, device, mp);
  return std::make_unique<LayerNorm>(c.n_embd, c.norm_eps, true, dtype, device, mp);
}

std::unique_ptr<FeedForward> make_mlp(const ModelConfig& c, DType dtype, Device device,
                                      const ModelParallel* mp) {
  if (c.is_llama())
    return std::make_unique<SwiGluMlp>(c.n_embd, c.ffn_hidden_size(), dtype, device, mp);
  return std::make_unique<Mlp>(c.n_embd, c.ffn_hidden_size(), true, dtype, device, mp);
}
}  // namespace

Block::Block(const ModelConfig& config, DType dtype, Device device, const ModelParallel* mp)
    : dropout_(config.dropout),
      checkpointing_(config.activation_checkpointing),
      mp_(mp),
      norm1_(make_norm(config, dtype, device, mp)),
      attn_(config, dtype, device, mp),
      norm2_(make_norm(config, dtype, device, mp)),
      mlp_(make_mlp(config, dtype, device, mp)) {
  const bool llama = config.is_llama();
  register_module(llama ? "attn_norm" : "ln_1", *norm1_);
  register_module("attn", attn_);
  register_module(llama ? "mlp_norm" : "ln_2", *norm2_);
  register_module("mlp", *mlp_);
}

Tensor Block::residual_dropout(const Tensor& branch, const Tensor& rows, int64_t seq_len,
                               Generator* gen, bool drop) const {
  if (!drop) return branch;
  if (!rows.defined()) return ops::dropout(branch, dropout_, *gen, true);
  return ops::dropout_rows(branch, dropout_, *gen, true, rows, seq_len, batch_.offset,
                           batch_.total);
}

Tensor Block::forward_region(const Tensor& x, const Tensor& positions, Generator* gen,
                             bool drop) const {
  // Under sequence/context parallelism x holds some rows of the sequence, under data
  // parallelism some elements of the batch: they draw the masks of those rows and elements in
  // the whole (B, T, C) tensor (Note [Dropout mask], rows form).
  Tensor rows = drop && mp_ ? mp_->activation_rows(positions) : Tensor();
  if (drop && batch_.total > 0 && !rows.defined())
    rows = ops::to_dtype(positions.detach(), DType::kI64);
  const int64_t len = mp_ ? mp_->sequence_length(positions.size(0)) : positions.size(0);
  Tensor h = ops::add(
      x, residual_dropout(attn_.forward(norm1_->forward(x), positions), rows, len, gen, drop));
  return ops::add(h, residual_dropout(mlp_->forward(norm2_->forward(h)), rows, len, gen, drop));
}

Tensor Block::forward(const Tensor& x, const Tensor& positions, Generator* dropout_gen) const {
  const bool drop = training() && dropout_ > 0.0;
  LOOM_CHECK(!drop || dropout_gen != nullptr, "Block: model.dropout ", dropout_,
             " in training mode needs a dropout generator");
  if (!checkpointing_ || !autograd::grad_enabled()) {
    return forward_region(x, positions, dropout_gen, drop);
  }
  std::vector<Generator*> gens;
  if (drop) gens.push_back(dropout_gen);
  const Tensor pos = positions.detach();
  CheckpointFn fn = [this, pos, dropout_gen, drop](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{forward_region(in[0], pos, dropout_gen, drop)};
  };
  return checkpoint(fn, {x}, gens)[0];
}

void Block::init(Generator& gen, double std, double proj_std) {
  norm1_->reset();
  attn_.init(gen, std, proj_std);
  norm2_->reset();
  mlp_->init(gen, std, proj_std);
}

}  // namespace loom
