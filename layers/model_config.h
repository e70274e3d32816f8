// layers/model_config.h — the sizes and choices that define a model. Plain data: filled from
// the `model:` section of a YAML config (train/config.cpp), never from code.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

// A scaled RoPE (Note [RoPE scaling] in layers/rope_scaling.h): Hugging Face's rope_scaling /
// rope_parameters, read by `convert` from config.json.
struct RopeScaling {
  std::string type = "none";              // none, linear, llama3 or yarn
  double factor = 1;                      // yarn: 0 → max_seq_len / original_max_seq_len
  double low_freq_factor = 1;             // llama3
  double high_freq_factor = 4;            // llama3
  int64_t original_max_seq_len = 0;       // llama3 (required), yarn (0: max_seq_len)
  double beta_fast = 32, beta_slow = 1;   // yarn's correction range, in rotations
  double attention_factor = 0;            // yarn's cos/sin scale; 0: from factor (and mscale)
  double mscale = 0, mscale_all_dim = 0;  // yarn (DeepSeek's form, both or neither)
  bool truncate = true;                   // yarn: correction dims rounded outwards
};

struct ModelConfig {
  std::string arch = "gpt2";  // "gpt2" (learned positions, LayerNorm, GELU, tied head, biases)
                              // or "llama" (RoPE, RMSNorm, SwiGLU, GQA, untied head, no biases)
  int64_t vocab_size = 50257;
  int64_t vocab_multiple = 128;  // the embedding/head are padded to a multiple of this
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_kv_head = 0;  // 0: same as n_head (multi-head); fewer: grouped-query
  int64_t n_embd = 768;
  int64_t explicit_head_dim = 0;  // model.head_dim; 0: n_embd / n_head (Qwen3, Mistral set it)
  int64_t max_seq_len = 1024;
  int64_t ffn_hidden = 0;      // 0: 4·n_embd (gpt2) or Llama's rule (see ffn_hidden_size())
  int64_t ffn_multiple = 256;  // llama: hidden rounded up to a multiple of this
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // llama only (gpt2 has every bias): biases on q, k, v and the output projection (Llama's
  // attention_bias), on q, k, v alone (Qwen2's), on the MLP's three layers (mlp_bias).
  bool attention_bias = false;
  bool qkv_bias = false;
  bool mlp_bias = false;
  // llama only: an RMSNorm over each head's q and k before RoPE (Qwen3's q_norm, k_norm).
  bool qk_norm = false;
  // Mistral's sliding-window attention span (0: none): row i attends the W keys up to itself
  // (Note [Sliding window] in layers/transformer.cpp).
  int64_t sliding_window = 0;
  double norm_eps = 1e-5;
  double dropout = 0.0;
  double init_std = 0.02;
  bool tie_embeddings = true;  // gpt2: true; llama: false
  // model.recompute: what a block keeps for its backward — none (all it saves), full (its input:
  // Note [Activation checkpoint] in core/checkpoint.h) or selective (its input and the results
  // of the ops model.recompute_save lists: Note [Selective recompute] there).
  std::string recompute = "none";
  std::string recompute_save = "matmul,attention";

  int64_t padded_vocab() const {
    return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple;
  }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : n_embd / n_head; }
  bool has_qkv_bias() const { return !is_llama() || attention_bias || qkv_bias; }
  bool has_proj_bias() const { return !is_llama() || attention_bias; }
  bool has_mlp_bias() const { return !is_llama() || mlp_bias; }
  bool is_llama() const { return arch == "llama"; }
  bool recomputes() const { return recompute != "none"; }
  // gpt2: 4·C. llama: 2/3 of 4·C, rounded up to ffn_multiple (the Llama recipe), unless given.
  int64_t ffn_hidden_size() const {
    if (ffn_hidden > 0) return ffn_hidden;
    if (!is_llama()) return 4 * n_embd;
    const int64_t h = 2 * 4 * n_embd / 3;
    return (h + ffn_multiple - 1) / ffn_multiple * ffn_multiple;
  }
};

}  // namespace loom
