// tools/tokenize.cpp — the `tokenize` command: GPT-2 BPE from the shell.
//   tokenize encode [--allow-special] [--bpe-dir DIR]   UTF-8 text on stdin → JSON id array
//   tokenize decode [--bpe-dir DIR]                     JSON id array on stdin → text
// Thin: parses arguments and calls data/tokenizer.h. The BPE directory defaults to $LOOM_BPE_DIR
// or the repository's data/gpt2-bpe found from the executable (see find_bpe_dir).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"

namespace {

constexpr const char* kUsage =
    "usage: tokenize encode [--allow-special] [--bpe-dir DIR]  (text on stdin -> JSON ids)\n"
    "       tokenize decode [--bpe-dir DIR]                    (JSON ids on stdin -> text)\n";

struct Args {
  std::string mode;
  std::string bpe_dir;
  bool allow_special = false;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "tokenize: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--allow-special") {
      a.allow_special = true;
    } else if (arg == "--bpe-dir") {
      if (i + 1 >= argc) usage_error("--bpe-dir needs a directory");
      a.bpe_dir = argv[++i];
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a.mode.empty() && (arg == "encode" || arg == "decode")) {
      a.mode = arg;
    } else {
      usage_error("unexpected argument '" + arg + "'");
    }
  }
  if (a.mode.empty()) usage_error("say encode or decode");
  if (a.allow_special && a.mode == "decode") usage_error("--allow-special is for encode");
  return a;
}

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::vector<int32_t> parse_ids(const std::string& text, int32_t vocab_size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL("tokenize decode: stdin is not JSON: ", e.what());
  }
  LOOM_CHECK(j.is_array(), "tokenize decode: stdin must be a JSON array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    LOOM_CHECK(
        j[i].is_number_integer() && j[i].get<int64_t>() >= 0 && j[i].get<int64_t>() < vocab_size,
        "tokenize decode: element ", i, " (", j[i].dump(), ") is not a token id in [0, ",
        vocab_size, ")");
    ids.push_back(static_cast<int32_t>(j[i].get<int64_t>()));
  }
  return ids;
}

int run(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  loom::Tokenizer tok(loom::find_bpe_dir(args.bpe_dir));
  const std::string input = read_stdin();
  if (args.mode == "encode") {
    const std::vector<int32_t> ids = tok.encode(input, args.allow_special);
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += ',';
      out += std::to_string(ids[i]);
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  } else {
    const std::string text = tok.decode(parse_ids(input, tok.vocab_size()));
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
