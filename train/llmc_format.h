// train/llmc_format.h — llm.c's GPT-2 model files (train_gpt2.c / train_gpt2.cu): reading the
// config, loading into and saving from a Transformer. Nothing here trains.
//
// Note [llm.c model file]: a header of 256 little-endian int32 — [0] magic 20240326, [1] version
// (3: f32 parameters, 5: bf16 parameters), [2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp, the
// rest zero — then the parameters back to back, each tensor stacked over layers: wte (Vp,C),
// wpe (maxT,C), ln1w (L,C), ln1b (L,C), qkvw (L,3C,C), qkvb (L,3C), attprojw (L,C,C),
// attprojb (L,C), ln2w (L,C), ln2b (L,C), fcw (L,4C,C), fcb (L,4C), fcprojw (L,C,4C),
// fcprojb (L,C), lnfw (C), lnfb (C). Loom's gpt2 parameters have exactly these per-layer shapes
// and qkv row order (Note [Fused qkv layout] in layers/attention.h), so layer l of a stacked
// tensor is blocks.{l}.<name> with no permutation.
#pragma once

#include <string>

#include "layers/model_config.h"
#include "layers/transformer.h"

namespace loom {

constexpr int kLlmcMagic = 20240326;
constexpr int kLlmcVersionF32 = 3;
constexpr int kLlmcVersionBF16 = 5;

// The gpt2 config the file's header describes (tied head; vocab_multiple chosen so that
// padded_vocab() equals the file's Vp). Errors name the file.
ModelConfig read_llmc_config(const std::string& path);
// Loads every parameter of `model` (any floating dtype) from the file. Errors name the file:
// unreadable, wrong magic, unsupported version, size not matching the header's parameter count,
// and a model whose config differs from the file's.
void load_llmc_model(const std::string& path, Transformer& model);
// Whether llm.c can hold a model of config c (a tied-head GPT-2 with sizes within int32): an
// InputError naming `path` when not, what save_llmc_model checks first.
void check_llmc_writable(const ModelConfig& c, const std::string& path);
// Writes `model` (a gpt2 with tied head) as version 3 (f32) or 5 (bf16, round-to-nearest-even),
// through a temporary file renamed into place. A model llm.c cannot hold (Llama, an untied head,
// sizes beyond int32) is an InputError naming the file.
void save_llmc_model(const std::string& path, const Transformer& model,
                     int version = kLlmcVersionF32);

}  // namespace loom
