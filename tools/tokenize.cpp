// tools/tokenize.cpp — the `tokenize` command: a tokenizer from the shell.
//   tokenize encode [--allow-special] [--sequence] [--jsonl] [--tokenizer SPEC] [--bpe-dir DIR]
//       UTF-8 text on stdin → a JSON id array (--jsonl: a JSON string per line → an array per
//       line; --sequence: with the tokenizer's ids around a sequence, BOS for Llama)
//   tokenize decode [--jsonl] [--tokenizer SPEC] [--bpe-dir DIR]
//       a JSON id array on stdin → text (--jsonl: an array per line → a JSON string per line)
//   tokenize chat [--chat-template FILE] [--tokenizer SPEC] [--bpe-dir DIR]
//       a conversation per line (prepare_data's chat JSONL) → {"ids", "mask", "text", "prompt"}:
//       the model's own Jinja template where the tokenizer has one (else FILE, else Loom's)
// Thin: parses arguments and calls data/tokenizer.h. SPEC is gpt2 (the default: the BPE
// directory from --bpe-dir, $LOOM_BPE_DIR or the repository's data/gpt2-bpe, see find_bpe_dir)
// or hf:PATH (a Hugging Face tokenizer.json, or a directory holding one).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/chat.h"
#include "data/chat_jinja.h"
#include "data/tokenizer.h"

namespace {

constexpr const char* kUsage =
    "usage: tokenize encode [--allow-special] [--sequence] [--jsonl] [--tokenizer gpt2|hf:PATH]\n"
    "                       [--bpe-dir DIR]                (text on stdin -> JSON ids)\n"
    "       tokenize decode [--jsonl] [--tokenizer gpt2|hf:PATH] [--bpe-dir DIR]\n"
    "                                                      (JSON ids on stdin -> text)\n"
    "       tokenize chat [--chat-template FILE] [--tokenizer gpt2|hf:PATH] [--bpe-dir DIR]\n"
    "                          (conversations, JSONL -> {text, ids, mask} per line)\n";

struct Args {
  std::string mode;
  std::string bpe_dir, tokenizer = "gpt2", chat_template;
  bool allow_special = false, sequence = false, jsonl = false;
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
    } else if (arg == "--sequence") {
      a.sequence = true;
    } else if (arg == "--jsonl") {
      a.jsonl = true;
    } else if (arg == "--chat-template") {
      if (i + 1 >= argc) usage_error("--chat-template needs a file");
      a.chat_template = argv[++i];
    } else if (arg == "--tokenizer") {
      if (i + 1 >= argc) usage_error("--tokenizer needs gpt2 or hf:PATH");
      a.tokenizer = argv[++i];
    } else if (arg == "--bpe-dir") {
      if (i + 1 >= argc) usage_error("--bpe-dir needs a directory");
      a.bpe_dir = argv[++i];
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a.mode.empty() && (arg == "encode" || arg == "decode" || arg == "chat")) {
      a.mode = arg;
    } else {
      usage_error("unexpected argument '" + arg + "'");
    }
  }
  if (a.mode.empty()) usage_error("say encode, decode or chat");
  if ((a.allow_special || a.sequence) && a.mode == "decode")
    usage_error("--allow-special and --sequence are for encode");
  return a;
}

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

nlohmann::json parse_json(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    LOOM_INPUT_FAIL("tokenize: ", where, " is not JSON (", e.what(), ")");
  }
}

std::vector<int32_t> parse_ids(const std::string& text, int32_t vocab_size,
                               const std::string& where) {
  const nlohmann::json j = parse_json(text, where);
  LOOM_INPUT_CHECK(j.is_array(), "tokenize decode: ", where, " must be a JSON array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    LOOM_INPUT_CHECK(
        j[i].is_number_integer() && j[i].get<int64_t>() >= 0 && j[i].get<int64_t>() < vocab_size,
        "tokenize decode: ", where, ": element ", i, " (", j[i].dump(),
        ") is not a token id in [0, ", vocab_size, ")");
    ids.push_back(static_cast<int32_t>(j[i].get<int64_t>()));
  }
  return ids;
}

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  return out + "]";
}

int run(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  loom::Tokenizer tok = loom::load_tokenizer(args.tokenizer, args.bpe_dir);
  const auto encode = [&](const std::string& text) {
    std::vector<int32_t> ids;
    if (args.sequence) ids = tok.sequence_prefix();
    tok.encode_append(text, args.allow_special, ids);
    if (args.sequence)
      ids.insert(ids.end(), tok.sequence_suffix().begin(), tok.sequence_suffix().end());
    return ids;
  };
  std::string out;
  if (args.mode == "chat") {  // what prepare_data --format chat writes, one line each
    std::optional<loom::ChatRenderer> renderer;
    std::optional<loom::JinjaChatTemplate> jinja;
    if (args.chat_template.empty() && !tok.chat_template().empty()) {
      jinja.emplace(loom::JinjaChatTemplate::of(tok));
      renderer.emplace(loom::JinjaChatTemplate::of(tok), tok);
    } else {
      renderer.emplace(args.chat_template.empty() ? loom::default_chat_template()
                                                  : loom::load_chat_template(args.chat_template),
                       tok);
    }
    std::ios::sync_with_stdio(false);
    std::string line;
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    for (int64_t n = 1; std::getline(std::cin, line); ++n) {
      const loom::Conversation conv = loom::parse_conversation(line, "stdin:" + std::to_string(n));
      renderer->render(conv, ids, mask);
      nlohmann::json j = {{"ids", ids}, {"mask", mask}};
      if (jinja) {  // the text, and the generation prompt after all turns but the last
        j["text"] = jinja->render(conv, false);
        j["prompt"] = jinja->render(conv, true, static_cast<int64_t>(conv.size()) - 1);
      }
      out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
  } else if (args.jsonl) {  // one JSON value per line, both ways
    std::ios::sync_with_stdio(false);
    std::string line;
    for (int64_t n = 1; std::getline(std::cin, line); ++n) {
      const std::string where = "stdin line " + std::to_string(n);
      if (args.mode == "encode") {
        const nlohmann::json j = parse_json(line, where);
        LOOM_INPUT_CHECK(j.is_string(), "tokenize encode: ", where, " is not a JSON string");
        out += ids_json(encode(j.get<std::string>())) + "\n";
      } else {
        out += nlohmann::json(tok.decode(parse_ids(line, tok.vocab_size(), where)))
                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
               "\n";
      }
    }
  } else if (args.mode == "encode") {
    out = ids_json(encode(read_stdin())) + "\n";
  } else {
    out = tok.decode(parse_ids(read_stdin(), tok.vocab_size(), "stdin"));
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
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
