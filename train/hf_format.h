// train/hf_format.h — Hugging Face model directories for GPT-2 and Llama (and the families in
// Llama's layout: Qwen2, Qwen3, Mistral): `config.json` and the
// weights as safetensors (one `model.safetensors`, or shards listed by
// `model.safetensors.index.json`), read into and written from Loom's global tensors (the names
// and shapes of a single-device Transformer). Nothing here trains or knows a parallel layout:
// the convert tool and train.init_from go through it, and resharding is the checkpoint's.
//
// Note [Hugging Face names]: per block i (GPT-2's names may lack the "transformer." prefix):
//   GPT-2  transformer.wte/wpe.weight         wte/wpe.weight (wte padded to Vp rows)
//          transformer.h.i.ln_1/ln_2.*        blocks.i.ln_1/ln_2.*
//          transformer.h.i.attn.c_attn.*      blocks.i.attn.qkv.*   (Conv1D: weight (in, out),
//          transformer.h.i.attn.c_proj.*      blocks.i.attn.proj.*   transposed to Loom's
//          transformer.h.i.mlp.c_fc/c_proj.*  blocks.i.mlp.fc/proj.*  (out, in))
//          transformer.ln_f.*                 ln_f.*; lm_head.weight only when untied
//   Llama  model.embed_tokens.weight          wte.weight (padded)
//          model.layers.i.self_attn.{q,k,v}_proj.weight   blocks.i.attn.qkv.weight (rows q, k, v:
//                                             Note [Fused qkv layout]; both rotate halves, so no
//                                             permutation: Note [RoPE pairing] in kernels/rope.h)
//          model.layers.i.self_attn.o_proj    blocks.i.attn.proj
//          model.layers.i.mlp.{gate,up,down}_proj   blocks.i.mlp.{gate,up,down}
//          model.layers.i.input_layernorm / post_attention_layernorm   attn_norm / mlp_norm
//          model.norm.weight                  norm_f.weight; lm_head.weight (padded) when untied
//          the biases where the config has them: {q,k,v}_proj.bias → attn.qkv.bias (rows q, k,
//          v), o_proj.bias → attn.proj.bias, {gate,up,down}_proj.bias → mlp.{gate,up,down}.bias
// Buffers transformers keeps in some files (attn.bias, masked_bias, rotary inv_freq) are skipped.
//
// Note [Hugging Face families]: model_type llama, qwen2, qwen3 and mistral are one Loom
// architecture (llama) with options: head_dim (when not hidden_size / heads), rope_scaling or
// rope_parameters (linear, llama3, yarn: Note [RoPE scaling] in layers/rope_scaling.h), Llama's
// and Qwen3's attention_bias (q, k, v and o) and Llama's mlp_bias, Qwen2's q, k, v biases
// (model.qkv_bias), Qwen3's per-head q/k RMSNorm (model.qk_norm: self_attn.q_norm/k_norm →
// attn.q_norm/k_norm, applied before RoPE), Mistral's sliding_window (model.sliding_window: Note
// [Sliding window] in layers/transformer.cpp). Written back, q/k norms make a qwen3
// directory, q, k, v biases alone a qwen2 one, a sliding window a mistral one, anything else a
// llama one. Refused naming the field: Qwen2's and Qwen3's use_sliding_window, layer_types other
// than full attention, partial rotary factors, RoPE types other than those three, hidden_act
// other than silu.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"
#include "layers/model_config.h"

namespace loom {

// The model config.json describes (model_type gpt2, llama, qwen2, qwen3 or mistral). vocab_multiple
// pads the vocabulary as Loom does. Errors name the file and the field, in Loom's words: a value of
// the wrong type, an integer key holding a non-integer (2.5) or a value beyond int64.
ModelConfig read_hf_config(const std::string& dir, int64_t vocab_multiple = 128);
// Every weight of the directory as Loom's global tensors, converted to `dtype` (the files may be
// f32, bf16 or f16), the vocabulary padded with zero rows. Errors (InputError) name the file
// and the tensor: a missing or unexpected name, a shape that does not fit the config, NaN or
// infinite values, an index whose weight_map entry is not a file name.
std::map<std::string, Tensor> read_hf_weights(const std::string& dir, const ModelConfig& c,
                                              DType dtype = DType::kF32);
// Writes dir/config.json (one that transformers loads) and the weights — Loom's global tensors,
// every parameter of a model with config c — in `dtype`: one model.safetensors, or shards of at
// most max_shard_bytes with model.safetensors.index.json. Each file goes through a temporary
// file renamed into place.
void write_hf_model(const std::string& dir, const ModelConfig& c,
                    const std::map<std::string, Tensor>& weights, DType dtype = DType::kF32,
                    int64_t max_shard_bytes = int64_t{5} << 30);

}  // namespace loom
