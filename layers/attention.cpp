// layers/attention.cpp — CausalSelfAttention (see layers/attention.h).
#include "layers/attention.h"

#include "core/ops/attention.h"
#include "core/ops/rope.h"
#include "core/ops/view.h"

namespace loom {

CausalSelfAttention::CausalSelfAttention(const ModelConfig& config, DType dtype, Device device)
    : n_head_(config.n_head),
      n_kv_head_(config.kv_heads()),
      head_dim_(config.head_dim()),
      rope_(config.is_llama()),
      rope_theta_(config.rope_theta),
      qkv_(config.n_embd, (config.n_head + 2 * config.kv_heads()) * config.head_dim(),
           !config.is_llama(), dtype, device),
      proj_(config.n_head * config.head_dim(), config.n_embd, !config.is_llama(), dtype, device) {
  register_module("qkv", qkv_);
  register_module("proj", proj_);
}

Tensor CausalSelfAttention::forward(const Tensor& x, const Tensor& positions) const {
  LOOM_CHECK(x.dim() == 3, "CausalSelfAttention: x must be (B, T, C), got ", shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), D = head_dim_;
  const Tensor qkv = qkv_.forward(x);  // (B, T, (Hq + 2·Hkv)·D)
  std::vector<Tensor> parts = ops::split(qkv, {n_head_ * D, n_kv_head_ * D, n_kv_head_ * D}, 2);
  Tensor q = ops::reshape(parts[0], {B, T, n_head_, D});
  Tensor k = ops::reshape(parts[1], {B, T, n_kv_head_, D});
  Tensor v = ops::reshape(parts[2], {B, T, n_kv_head_, D});
  if (rope_) {
    q = ops::rope(q, positions, rope_theta_);
    k = ops::rope(k, positions, rope_theta_);
  }
  // (B, T, H, D) → (B, H, T, D) for the attention op, and back.
  const Tensor y = ops::causal_attention(ops::transpose(q, 1, 2), ops::transpose(k, 1, 2),
                                         ops::transpose(v, 1, 2));
  return proj_.forward(ops::reshape(ops::transpose(y, 1, 2), {B, T, n_head_ * D}));
}

void CausalSelfAttention::init(Generator& gen, double std, double proj_std) {
  qkv_.init(gen, std);
  proj_.init(gen, proj_std);
}

}  // namespace loom
