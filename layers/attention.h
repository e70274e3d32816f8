// layers/attention.h — CausalSelfAttention: a fused qkv Linear, optional RoPE, the fused causal
// attention op (grouped-query when n_kv_head < n_head) and an output projection.
//
// Note [Fused qkv layout]: qkv.weight is ((Hq + 2·Hkv)·D, C) with rows [q; k; v]: q rows
// [0, Hq·D), then k rows (Hkv·D), then v rows (Hkv·D); inside each, head h owns rows
// [h·D, (h+1)·D). This is llm.c's qkvw layout (Hugging Face GPT-2's c_attn, transposed), so
// llm.c files load without any permutation. Tensor-parallel sharding of this weight must split
// q, k and v separately by heads, not the fused rows contiguously.
#pragma once

#include <cstdint>
#include <memory>

#include "core/tensor.h"
#include "kernels/rope.h"
#include "layers/build_context.h"
#include "layers/model_config.h"
#include "layers/module.h"
#include "layers/norm.h"

namespace loom {

class CausalSelfAttention : public Module {
 public:
  // Sizes from config (n_embd, n_head, kv_heads(), head_dim()); biases for gpt2; for llama RoPE
  // (scaled per config.rope_scaling) and the biases the config names.
  // qkv is ctx.linear's attn_in for block `layer` (a column layer with segments {q, k, v},
  // split by heads), proj its attn_out (a row layer); this rank computes the heads the built
  // qkv layer's output holds (Note [Per-block MLP layers] in layers/build_context.h: n_head/s
  // query and kv_heads/s kv heads under a split s = feature_split()); the heads meet in
  // ctx.attention (layers/build_context.h).
  CausalSelfAttention(const ModelConfig& config, DType dtype = DType::kF32, Device device = {},
                      const LayerContext& ctx = {}, int64_t layer = 0);
  // x (B, T, C); positions (T) integer: the global index of each token, or with packed documents
  // its index in its document (used by RoPE; ignored without it); doc_start (T) i32 on the
  // device or undefined: packed documents, attention kept inside each (Note [Packed documents]
  // in kernels/attention.h). Returns (B, T, C).
  Tensor forward(const Tensor& x, const Tensor& positions, const Tensor& doc_start = {}) const;
  // qkv ← N(0, std²), proj ← N(0, proj_std²), biases ← 0.
  void init(Generator& gen, double std, double proj_std);

  const LinearLayer& qkv() const { return *qkv_; }
  const LinearLayer& proj() const { return *proj_; }

 private:
  AttentionFn attention_;
  int64_t n_head_, n_kv_head_, head_dim_;  // heads on this rank
  bool rope_;
  kernels::RopeFrequencies rope_freqs_;       // layers/rope_scaling.h
  std::unique_ptr<RMSNorm> q_norm_, k_norm_;  // config.qk_norm (Qwen3)
  std::unique_ptr<LinearLayer> qkv_;          // (Hq + 2·Hkv)·D × C, Note [Fused qkv layout]
  std::unique_ptr<LinearLayer> proj_;         // C × Hq·D
};

}  // namespace loom
