// layers/attention.cpp — CausalSelfAttention (see layers/attention.h).
#include "layers/attention.h"

#include "core/ops/rope.h"
#include "core/ops/view.h"
#include "layers/rope_scaling.h"

namespace loom {

CausalSelfAttention::CausalSelfAttention(const ModelConfig& config, DType dtype, Device device,
                                         const LayerContext& ctx, int64_t layer)
    : attention_(ctx.attention),
      n_head_(config.n_head),
      n_kv_head_(config.kv_heads()),
      head_dim_(config.head_dim()),
      rope_(config.is_llama()),
      rope_freqs_(config.is_llama() ? rope_frequencies(config) : kernels::RopeFrequencies{}) {
  const int64_t C = config.n_embd, D = head_dim_, q = n_head_ * D, kv = n_kv_head_ * D;

  const int split = ctx.linear->feature_split();
  LOOM_CHECK(n_head_ % split == 0 && n_kv_head_ % split == 0, "CausalSelfAttention: ", n_head_,
             " query and ", n_kv_head_, " kv heads do not divide by the tensor-parallel size ",
             split);
  LOOM_CHECK(n_kv_head_ > 0 && n_head_ % n_kv_head_ == 0, "CausalSelfAttention: ", n_head_,
             " query heads are not a multiple of the ", n_kv_head_, " kv heads (model.n_kv_head)");
  qkv_ = ctx.linear->attn_in(layer, C, {q, kv, kv}, config.has_qkv_bias(), dtype, device);
  proj_ = ctx.linear->attn_out(layer, q, C, config.has_proj_bias(), dtype, device);
  // Note [Per-block MLP layers]: the heads this rank computes are those of the built qkv layer,
  // whole kv groups (g query heads, one k and one v head each).
  const int64_t g = n_head_ / n_kv_head_, group = (g + 2) * D, out = qkv_->out_features();
  LOOM_CHECK(out > 0 && out % group == 0, "CausalSelfAttention: block ", layer, "'s qkv layer has ",
             out, " output features, not whole kv groups of ", group, " (", g,
             " query heads, one k and one v head of ", D, ")");
  n_kv_head_ = out / group;
  n_head_ = g * n_kv_head_;
  LOOM_CHECK(proj_->in_features() == n_head_ * D, "CausalSelfAttention: block ", layer,
             "'s proj layer takes ", proj_->in_features(), " input features, not the ", n_head_ * D,
             " of its ", n_head_, " query heads");
  register_module("qkv", *qkv_);
  register_module("proj", *proj_);
  if (config.qk_norm) {
    q_norm_ = std::make_unique<RMSNorm>(D, config.norm_eps, dtype, device, ctx, true);
    k_norm_ = std::make_unique<RMSNorm>(D, config.norm_eps, dtype, device, ctx, true);
    register_module("q_norm", *q_norm_);
    register_module("k_norm", *k_norm_);
  }
}

Tensor CausalSelfAttention::forward(const Tensor& x, const Tensor& positions,
                                    const Tensor& doc_start) const {
  LOOM_CHECK(x.dim() == 3, "CausalSelfAttention: x must be (B, T, C), got ", shape_str(x.shape()));
  const int64_t B = x.size(0), D = head_dim_;
  const Tensor qkv = qkv_->forward(x);  // (B, T, (Hq + 2·Hkv)·D); T is the full local sequence
  const int64_t T = qkv.size(1);        // (x is sequence-sharded under sequence parallelism)
  std::vector<Tensor> parts = ops::split(qkv, {n_head_ * D, n_kv_head_ * D, n_kv_head_ * D}, 2);
  Tensor q = ops::reshape(parts[0], {B, T, n_head_, D});
  Tensor k = ops::reshape(parts[1], {B, T, n_kv_head_, D});
  Tensor v = ops::reshape(parts[2], {B, T, n_kv_head_, D});
  if (q_norm_) {  // over each head's D, before RoPE (Qwen3)
    q = q_norm_->forward(q);
    k = k_norm_->forward(k);
  }
  if (rope_) {
    q = ops::rope(q, positions, rope_freqs_);
    k = ops::rope(k, positions, rope_freqs_);
  }
  // (B, T, H, D) → (B, H, T, D) for the attention op, and back.
  const Tensor qh = ops::transpose(q, 1, 2), kh = ops::transpose(k, 1, 2),
               vh = ops::transpose(v, 1, 2);
  const Tensor y = attention_(qh, kh, vh, doc_start);
  return proj_->forward(ops::reshape(ops::transpose(y, 1, 2), {B, T, n_head_ * D}));
}

void CausalSelfAttention::init(Generator& gen, double std, double proj_std) {
  qkv_->init(gen, std);
  proj_->init(gen, proj_std);
  if (q_norm_) {
    q_norm_->reset();
    k_norm_->reset();
  }
}

}  // namespace loom
