// layers/model_config.h — the sizes and choices that define a model. Plain data: filled from
// the `model:` section of a YAML config (train/config.cpp), never from code.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

struct ModelConfig {
  std::string arch = "gpt2";  // "gpt2" (learned positions, LayerNorm, GELU, tied head, biases)
                              // or "llama" (RoPE, RMSNorm, SwiGLU, GQA, untied head, no biases)
  int64_t vocab_size = 50257;
  int64_t vocab_multiple = 128;  // the embedding/head are padded to a multiple of this
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_kv_head = 0;  // 0: same as n_head (multi-head); fewer: grouped-query
  int64_t n_embd = 768;
  int64_t max_seq_len = 1024;
  int64_t ffn_hidden = 0;      // 0: 4·n_embd (gpt2) or Llama's rule (see ffn_hidden_size())
  int64_t ffn_multiple = 256;  // llama: hidden rounded up to a multiple of this
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  double dropout = 0.0;
  double init_std = 0.02;
  bool tie_embeddings = true;  // gpt2: true; llama: false
  bool activation_checkpointing = false;

  int64_t padded_vocab() const {
    return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple;
  }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_dim() const { return n_embd / n_head; }
  bool is_llama() const { return arch == "llama"; }
  // gpt2: 4·C. llama: 2/3 of 4·C, rounded up to ffn_multiple (the Llama recipe), unless given.
  int64_t ffn_hidden_size() const {
    if (ffn_hidden > 0) return ffn_hidden;
    if (!is_llama()) return 4 * n_embd;
    const int64_t h = 2 * 4 * n_embd / 3;
    return (h + ffn_multiple - 1) / ffn_multiple * ffn_multiple;
  }
};

}  // namespace loom
