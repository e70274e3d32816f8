// train/convert.h — checkpoint conversion between ecosystems, what tools/convert runs: a model
// in one of three forms read as Loom's global tensors and written as another.
//   hf:DIR     a Hugging Face GPT-2 or Llama directory (train/hf_format.h)
//   llmc:FILE  an llm.c GPT-2 model file, version 3 (f32) or 5 (bf16) (train/llmc_format.h)
//   loom:DIR   a native checkpoint (train/checkpoint.h). As a source, any checkpoint directory
//              (step_N/, any layout) or a run's checkpoints folder (its newest checkpoint, as
//              train.init_from takes it); as a destination, a checkpoints root: the checkpoint
//              is written as DIR/step_<step>/, one file of whole tensors (a consolidated
//              checkpoint that any layout reads, and train.init_from takes).
// A Hugging Face destination also gets the tokenizer's files (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, tokenizer.model) where convert knows them: from
// a Hugging Face source, or beside a Loom checkpoint's data.tokenizer (hf:PATH).
// A destination that holds anything is refused unless forced, and is written beside itself and
// renamed into place whole (Note [Convert destinations] in train/convert.cpp); a model is never
// written onto its own source. NaN or infinite weights, and values the written dtype cannot hold
// (f16 beyond 65504), are refused, naming the tensor.
// loom → loom consolidates (parameters and optimizer state, the run's state, one file); a
// checkpoint needs no offline resharding, since every layout reads any other (Note [Pieces]).
// verify reads every stored tensor back, checking checksums, completeness and finiteness.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "core/dtype.h"
#include "layers/transformer.h"

namespace loom {

struct ConvertOptions {
  DType dtype = DType::kF32;                   // of the written weights (hf, loom)
  int llmc_version = 3;                        // 3: f32, 5: bf16
  int64_t vocab_multiple = 128;                // padding of the vocabulary read from hf
  int64_t max_shard_bytes = int64_t{5} << 30;  // hf: larger models are written in shards
  std::ostream* progress = nullptr;            // one line per tenth of the tensors
  bool force = false;                          // replace a destination that holds something
};

// Converts `from` into `to` (each "hf:…", "llmc:…" or "loom:…"); returns what it wrote (a
// directory or file). Errors name the file and the tensor: InputError for a file or destination,
// ConfigError for a malformed location or a destination that is the source.
std::string convert_model(const std::string& from, const std::string& to,
                          const ConvertOptions& options);

// train.init_from: the weights of `from` — a native checkpoint directory (any layout's), a
// Hugging Face directory (one with config.json, whose model must equal model's config: a
// differing key is a ConfigError naming it), a run's checkpoints folder (its newest checkpoint)
// or an llm.c file — into `model`, each parameter
// taking the part its placement says (a tensor-parallel part, or the whole tensor): call it
// before the model is staged or sharded. One line to `log`.
void load_model_weights(Transformer& model, const std::string& from, std::ostream& log);

// Reads every tensor of checkpoint `dir` back and writes a report to `out` (tensors, bytes,
// the step, files); returns false (after reporting what is wrong) when anything is damaged.
bool verify_checkpoint(const std::string& dir, std::ostream& out);

}  // namespace loom
