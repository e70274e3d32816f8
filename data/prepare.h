// data/prepare.h — the library behind tools/prepare_data: list input files, split them into
// documents, tokenize, and write train/val token shards (data/shard.h) named like llm.c's
// (DIR/train_000000.bin, DIR/val_000000.bin); chat/instruction data (--format chat) becomes
// document shards with loss masks (data/documents.h, data/chat.h). Deterministic: same inputs
// and options, same bytes. It prints nothing itself; progress goes to a callback.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace loom {

enum class InputFormat {
  kText,      // documents separated by the literal text "<|endoftext|>" (else one per file)
  kFortunes,  // fortune(6) files: documents separated by lines holding only "%"
  kChat,      // JSONL, one conversation per line (data/chat.h): document shards with loss masks
};
InputFormat parse_input_format(const std::string& name);  // "text" | "fortunes" | "chat"

struct PrepareOptions {
  std::vector<std::string> inputs;  // files, or directories (walked recursively)
  std::string out_dir;
  double val_fraction = 0.05;          // in [0, 1); 0 writes no val shards
  int64_t shard_tokens = 100'000'000;  // tokens per shard (the last one may be shorter)
  InputFormat format = InputFormat::kText;
  // kChat: a YAML template file or a Jinja one (*.jinja, rendered with the tokenizer's bos and
  // eos); empty: the tokenizer's own Jinja template, else default_chat_template()
  std::string chat_template;
};

struct PrepareProgress {
  int64_t bytes_done = 0, bytes_total = 0;
  int64_t documents = 0, tokens = 0;
  double seconds = 0;
};

struct PrepareResult {
  int64_t documents = 0, train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t train_loss_tokens = 0, val_loss_tokens = 0;  // kChat: tokens with loss mask 1; else 0
  std::vector<std::string> train_shards, val_shards;
  double seconds = 0;
};

// The input files in processing order: each file argument as given; each directory's regular
// files, recursively, sorted by path, skipping symlinks and hidden entries. For kFortunes,
// directory walks also skip *.dat and *.u8 files and the "off" (offensive) subdirectory; for
// kChat they take only *.jsonl files.
std::vector<std::string> list_input_files(const std::vector<std::string>& inputs,
                                          InputFormat format);

// Whether `text` holds only ASCII whitespace (space, \t, \n, \r, \v, \f), or nothing.
bool is_blank(std::string_view text);

// One file's documents (views into `text`) for kText and kFortunes. Empty and whitespace-only
// documents are dropped.
std::vector<std::string_view> split_documents(std::string_view text, InputFormat format);

// Every val_every(f)-th document (index % k == 0, counting all documents of the run from 0)
// goes to val: k = round(1/f); 0 when f == 0 (no val split).
int64_t val_every(double val_fraction);

// Tokenizes everything into opts.out_dir (created if needed). Each document is written as
// <|endoftext|> followed by its tokens (llm.c's convention), to the train or val stream. kChat
// renders each non-blank JSONL line (Note [Chat rendering] in data/chat.cpp) and writes document
// shards (X.bin + X.docs) that hold whole documents only: a shard is closed before a document
// that would overflow --shard-tokens, and a longer document is an error naming file:line.
// Refuses an out_dir that already holds train_*.bin / val_*.bin shards; a failed run removes
// what it wrote (and out_dir, if it made it).
PrepareResult prepare_data(const PrepareOptions& opts, Tokenizer& tokenizer,
                           const std::function<void(const PrepareProgress&)>& progress = {});

}  // namespace loom
