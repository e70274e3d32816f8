// tools/convert.cpp — converts models between Hugging Face, llm.c and Loom checkpoints, and
// verifies checkpoints (train/convert.h). Thin: parses arguments, calls the library.
//
//   convert --from hf:DIR|llmc:FILE|loom:DIR --to hf:DIR|llmc:FILE|loom:ROOT
//           [--dtype f32|bf16|f16] [--llmc-version 3|5] [--vocab-multiple N] [--max-shard-mb N]
//   convert verify CHECKPOINT_DIR
#include "train/convert.h"

#include <cstdlib>
#include <iostream>
#include <string>

#include "core/error.h"
#include "train/config.h"

namespace {

int usage() {
  std::cerr << "usage: convert --from hf:DIR|llmc:FILE|loom:DIR --to hf:DIR|llmc:FILE|loom:ROOT\n"
               "               [--dtype f32|bf16|f16] [--llmc-version 3|5] [--vocab-multiple N]\n"
               "               [--max-shard-mb N]\n"
               "       convert verify CHECKPOINT_DIR\n";
  return 2;
}

// A positive integer argument, or a usage error naming the flag.
bool positive(const std::string& flag, const std::string& text, int64_t* out) {
  try {
    size_t used = 0;
    *out = std::stoll(text, &used);
    if (used == text.size() && *out > 0) return true;
  } catch (const std::exception&) {
  }
  std::cerr << "convert: " << flag << ": '" << text << "' is not a positive integer\n";
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "verify")
    return loom::verify_checkpoint(argv[2], std::cout) ? 0 : 1;
  std::string from, to;
  loom::ConvertOptions o;
  o.progress = &std::cerr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    int64_t n = 0;
    if (a == "--from") {
      from = v;
    } else if (a == "--to") {
      to = v;
    } else if (a == "--dtype") {
      if (v != "f32" && v != "bf16" && v != "f16") {
        std::cerr << "convert: --dtype: '" << v << "' is not f32, bf16 or f16\n";
        return 2;
      }
      o.dtype = loom::train_dtype(v);
    } else if (a == "--llmc-version") {
      if (v != "3" && v != "5") {
        std::cerr << "convert: --llmc-version: '" << v << "' is not 3 (f32) or 5 (bf16)\n";
        return 2;
      }
      o.llmc_version = std::stoi(v);
    } else if (a == "--vocab-multiple") {
      if (!positive(a, v, &n)) return 2;
      o.vocab_multiple = n;
    } else if (a == "--max-shard-mb") {
      if (!positive(a, v, &n)) return 2;
      o.max_shard_bytes = n << 20;
    } else {
      return usage();
    }
  }
  if (from.empty() || to.empty()) return usage();
  try {
    std::cout << loom::convert_model(from, to, o) << "\n";
  } catch (const loom::Error& e) {
    std::cerr << "convert: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
