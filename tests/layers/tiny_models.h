// tests/layers/tiny_models.h — shared helpers for the layer tests: tiny gpt2 / llama configs,
// token batches, and parameter perturbation. Header-only; tests only.
#pragma once

#include <cstdint>
#include <vector>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "layers/model_config.h"
#include "layers/transformer.h"

namespace loom::testing {

// n_layer 2, n_embd 8, n_head 2, vocab 11 padded to 12, max_seq_len 8.
inline ModelConfig tiny_gpt2() {
  ModelConfig c;
  c.arch = "gpt2";
  c.vocab_size = 11;
  c.vocab_multiple = 4;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.max_seq_len = 8;
  c.tie_embeddings = true;
  return c;
}

// As tiny_gpt2, with one kv head (GQA), RoPE, RMSNorm, SwiGLU (hidden 24), untied head.
inline ModelConfig tiny_llama() {
  ModelConfig c = tiny_gpt2();
  c.arch = "llama";
  c.n_kv_head = 1;
  c.ffn_multiple = 8;
  c.tie_embeddings = false;
  return c;
}

// (B, T) i32 tokens uniform in [0, vocab).
inline Tensor random_ids(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  return randint({B, T}, 0, vocab, gen, DType::kI32);
}

// Adds N(0, std²) noise to every parameter (so norms and biases are not at 1 / 0).
inline void perturb_parameters(const Module& m, double std, uint64_t seed) {
  Generator gen(seed);
  autograd::NoGradGuard no_grad;
  for (auto& [name, p] : m.named_parameters()) {
    Tensor dst = p;
    ops::add_(dst, randn(p.shape(), gen, p.dtype(), 0.0, std));
  }
}

}  // namespace loom::testing
