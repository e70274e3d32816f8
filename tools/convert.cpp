// tools/convert.cpp — converts models between Hugging Face, llm.c and Loom checkpoints, and
// verifies checkpoints (train/convert.h). Thin: parses arguments, calls the library, and says
// any failure in one line of Loom's words (exit 1), never an abort.
//
//   convert --from hf:DIR|llmc:FILE|loom:DIR --to hf:DIR|llmc:FILE|loom:ROOT [--force]
//           [--dtype f32|bf16|f16] [--llmc-version 3|5] [--vocab-multiple N] [--max-shard-mb N]
//   convert verify CHECKPOINT_DIR
#include "train/convert.h"

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <new>
#include <string>

#include "core/error.h"
#include "train/config.h"

namespace {

// The usage text to `out`; returns `rc` (2 for a usage mistake, 0 for --help).
int usage(std::ostream& out = std::cerr, int rc = 2) {
  out << "usage: convert --from hf:DIR|llmc:FILE|loom:DIR --to hf:DIR|llmc:FILE|loom:ROOT\n"
         "               [--force] [--dtype f32|bf16|f16] [--llmc-version 3|5]\n"
         "               [--vocab-multiple N] [--max-shard-mb N]\n"
         "       convert verify CHECKPOINT_DIR\n"
         "  --from loom:DIR  a checkpoint, or a run's checkpoints folder (its newest checkpoint)\n"
         "  --to loom:ROOT   writes ROOT/step_<step>/\n"
         "  --force          replace a destination that holds something (refused otherwise);\n"
         "                   it is written beside itself and renamed into place whole, and a\n"
         "                   model is never written onto its own source\n"
         "  --dtype          of the written weights (hf, loom); f16 refuses values beyond 65504\n";
  return rc;
}

// Runs f, saying any failure in one line: Loom's errors as they are (a user's mistake carries
// no source location), a file system's or the allocator's in Loom's words. Exit status 1.
int guarded(const std::function<int()>& f) {
  try {
    return f();
  } catch (const loom::Error& e) {
    std::cerr << "convert: " << e.what() << "\n";
  } catch (const loom::ConfigError& e) {
    std::cerr << "convert: " << e.what() << "\n";
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "convert: " << e.path1().string() << ": " << e.code().message() << "\n";
  } catch (const std::bad_alloc&) {
    std::cerr << "convert: out of memory\n";
  } catch (const std::exception& e) {
    std::cerr << "convert: internal error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "convert: internal error (an unknown exception)\n";
  }
  return 1;
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
    return guarded([&] { return loom::verify_checkpoint(argv[2], std::cout) ? 0 : 1; });
  std::string from, to;
  loom::ConvertOptions o;
  o.progress = &std::cerr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--force") {
      o.force = true;
      continue;
    }
    if (a == "--help" || a == "-h") return usage(std::cout, 0);
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
  return guarded([&] {
    std::cout << loom::convert_model(from, to, o) << "\n";
    return 0;
  });
}
