// tools/prepare_data.cpp — the `prepare_data` command: tokenize text into llm.c token shards, or
// chat/instruction JSONL into document shards with loss masks (--format chat).
//   prepare_data --input PATH... --out-dir DIR [--val-fraction 0.05] [--shard-tokens N]
//                [--format text|fortunes|chat] [--chat-template FILE] [--bpe-dir DIR]
//                [--tokenizer gpt2|hf:PATH]
// Thin: parses arguments, draws the progress bar on stderr, and calls data/prepare.h. A failure
// is one line on stderr, "prepare_data: <what is wrong>" (exit 2 for a bad option, else 1).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/error.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

namespace {

constexpr const char* kUsage =
    "usage: prepare_data --input PATH... --out-dir DIR [--val-fraction 0.05]\n"
    "                    [--shard-tokens 100000000] [--format text|fortunes|chat]\n"
    "                    [--chat-template FILE] [--bpe-dir DIR] [--tokenizer gpt2|hf:PATH]\n"
    "  text:     documents are separated by the text <|endoftext|> (else one per file)\n"
    "  fortunes: documents are separated by lines holding only %; directories skip *.dat,\n"
    "            *.u8, symlinks and off/ (e.g. --input /usr/share/games/fortunes)\n"
    "  chat:     JSONL, one conversation per line, either\n"
    "              {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, ...]}\n"
    "            (roles system, user, assistant) or {\"prompt\": \"...\", \"response\": \"...\"};\n"
    "            directories give their *.jsonl files. Writes document shards (X.bin + X.docs:\n"
    "            document boundaries and a loss mask on the assistant turns) that hold whole\n"
    "            conversations (e.g. --input data/samples/chat_sample.jsonl)\n"
    "  --chat-template FILE: YAML with system/user/assistant prefix and suffix strings, or a\n"
    "            Hugging Face Jinja chat template (FILE.jinja) rendered with the tokenizer's\n"
    "            bos/eos (default: the tokenizer's own template from tokenizer_config.json,\n"
    "            else the built-in one, as in configs/chat_template.yaml)\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "prepare_data: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

struct Args {
  loom::PrepareOptions opts;
  std::string bpe_dir, tokenizer = "gpt2";
};

double parse_number(const std::string& flag, const char* text) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0') usage_error(flag + " " + text + ": not a number");
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--input") {
      a.opts.inputs.push_back(value());
      while (i + 1 < argc && argv[i + 1][0] != '-') a.opts.inputs.push_back(argv[++i]);
    } else if (arg == "--out-dir") {
      a.opts.out_dir = value();
    } else if (arg == "--val-fraction") {
      a.opts.val_fraction = parse_number(arg, value());
    } else if (arg == "--shard-tokens") {
      const double n = parse_number(arg, value());
      if (n < 1 || n != static_cast<double>(static_cast<int64_t>(n))) {
        usage_error("--shard-tokens must be a positive integer");
      }
      a.opts.shard_tokens = static_cast<int64_t>(n);
    } else if (arg == "--format") {
      a.opts.format = loom::parse_input_format(value());
    } else if (arg == "--chat-template") {
      a.opts.chat_template = value();
    } else if (arg == "--bpe-dir") {
      a.bpe_dir = value();
    } else if (arg == "--tokenizer") {
      a.tokenizer = value();
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      usage_error("unexpected argument '" + arg + "'");
    }
  }
  if (a.opts.inputs.empty()) usage_error("--input is required");
  if (a.opts.out_dir.empty()) usage_error("--out-dir is required");
  return a;
}

// Redraws one status line on stderr, at most ~10 times a second (and always at the end).
class ProgressBar {
 public:
  void operator()(const loom::PrepareProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    const bool done = p.bytes_done >= p.bytes_total;
    if (!done && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double frac = p.bytes_total > 0 ? static_cast<double>(p.bytes_done) / p.bytes_total : 1;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    const double secs = std::max(p.seconds, 1e-9);
    std::fprintf(stderr, "\r[%s] %5.1f%%  %.1f/%.1f MB  %lld docs  %lld tokens  %.0f tokens/s  ",
                 bar.c_str(), 100 * frac, p.bytes_done / 1e6, p.bytes_total / 1e6,
                 static_cast<long long>(p.documents), static_cast<long long>(p.tokens),
                 p.tokens / secs);
    open_ = !done;
    if (done) std::fputc('\n', stderr);
  }
  // Ends a bar left mid-line (a failed run), so the next message starts a line of its own.
  void end_line() {
    if (open_) std::fputc('\n', stderr);
    open_ = false;
  }

 private:
  std::chrono::steady_clock::time_point last_{};
  bool open_ = false;  // a bar is drawn and its line not ended
};

int run(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  loom::Tokenizer tokenizer = loom::load_tokenizer(args.tokenizer, args.bpe_dir);
  ProgressBar bar;
  loom::PrepareResult r;
  try {
    r = loom::prepare_data(args.opts, tokenizer, [&](const loom::PrepareProgress& p) { bar(p); });
  } catch (...) {
    bar.end_line();
    throw;
  }
  std::fprintf(stderr,
               "prepare_data: %lld documents -> train %lld docs / %lld tokens in %zu shard(s), "
               "val %lld docs / %lld tokens in %zu shard(s), %.1f s (%.0f tokens/s)\n",
               static_cast<long long>(r.documents), static_cast<long long>(r.train_documents),
               static_cast<long long>(r.train_tokens), r.train_shards.size(),
               static_cast<long long>(r.val_documents), static_cast<long long>(r.val_tokens),
               r.val_shards.size(), r.seconds,
               (r.train_tokens + r.val_tokens) / std::max(r.seconds, 1e-9));
  if (args.opts.format == loom::InputFormat::kChat) {
    std::fprintf(stderr, "prepare_data: loss tokens (assistant turns): train %lld, val %lld\n",
                 static_cast<long long>(r.train_loss_tokens),
                 static_cast<long long>(r.val_loss_tokens));
  }
  for (const auto& p : r.train_shards) std::printf("%s\n", p.c_str());
  for (const auto& p : r.val_shards) std::printf("%s\n", p.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const loom::ConfigError& e) {
    std::fprintf(stderr, "prepare_data: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "prepare_data: %s\n", e.what());
    return 1;
  }
}
