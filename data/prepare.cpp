// data/prepare.cpp — prepare_data's library: input listing, document splitting (or chat
// rendering), tokenization on every thread (Note [Parallel tokenization]) and train/val shard
// streams. Deterministic whatever the threads; prints nothing.
#include "data/prepare.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>

#include "core/error.h"
#include "core/read_file.h"
#include "data/chat.h"
#include "data/chat_jinja.h"
#include "data/documents.h"
#include "data/shard.h"

namespace loom {
namespace {

constexpr size_t kBatchDocs = 4096;  // documents tokenized together (Note [Parallel tokenization])

namespace fs = std::filesystem;

constexpr std::string_view kEotText = "<|endoftext|>";
constexpr int64_t kProgressBytes = int64_t{1} << 20;  // report at least every MiB of input

std::string read_input_file(const std::string& path) {
  std::string text;
  const std::string why = read_whole_file(path, text);
  LOOM_INPUT_CHECK(why.empty(), path, ": cannot read the input file: ", why);
  return text;
}

bool is_shard_name(const std::string& name) {
  for (const std::string_view prefix : {"train_", "val_"}) {
    if (!name.starts_with(prefix) || !name.ends_with(".bin")) continue;
    const std::string_view digits =
        std::string_view(name).substr(prefix.size(), name.size() - prefix.size() - 4);
    const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
    if (!digits.empty() && std::all_of(digits.begin(), digits.end(), is_digit)) return true;
  }
  return false;
}

void walk_directory(const fs::path& dir, InputFormat format, std::vector<std::string>& out) {
  std::vector<fs::path> entries;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    entries.push_back(it->path());
  }
  LOOM_INPUT_CHECK(!ec, dir.string(), ": cannot list the input directory: ", ec.message());
  std::sort(entries.begin(), entries.end());
  for (const fs::path& p : entries) {
    const std::string name = p.filename().string();
    if (name.starts_with(".") || fs::is_symlink(fs::symlink_status(p))) continue;
    if (fs::is_directory(p)) {
      if (format == InputFormat::kFortunes && name == "off") continue;
      walk_directory(p, format, out);
    } else if (fs::is_regular_file(p)) {
      const std::string ext = p.extension().string();
      if (format == InputFormat::kFortunes && (ext == ".dat" || ext == ".u8")) continue;
      if (format == InputFormat::kChat && ext != ".jsonl") continue;
      out.push_back(p.string());
    }
  }
}

// Collects the documents of one split (train or val) and writes them out in shards of at most
// shard_tokens tokens. Plain shards are cut at exactly shard_tokens (documents may continue in
// the next shard); document shards (with_docs: X.bin + X.docs) hold whole documents only, so a
// shard is closed early before a document that would overflow it (the caller checks that each
// document fits one shard). The shard paths go to `paths` as they are written.
class ShardStream {
 public:
  ShardStream(std::string dir, std::string prefix, int64_t shard_tokens, bool with_docs, int width,
              std::vector<std::string>& paths)
      : dir_(std::move(dir)),
        prefix_(std::move(prefix)),
        shard_tokens_(shard_tokens),
        with_docs_(with_docs),
        width_(width),
        paths_(paths) {}

  // `mask`: with_docs only, one value per token.
  void append(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& mask) {
    const auto n = static_cast<int64_t>(tokens.size());
    total_ += n;
    if (!with_docs_) {
      for (const int32_t t : tokens) {
        buffer_.push_back(t);
        if (static_cast<int64_t>(buffer_.size()) == shard_tokens_) flush();
      }
      return;
    }
    if (static_cast<int64_t>(buffer_.size()) + n > shard_tokens_) flush();
    buffer_.insert(buffer_.end(), tokens.begin(), tokens.end());
    mask_.insert(mask_.end(), mask.begin(), mask.end());
    offsets_.push_back(static_cast<int64_t>(buffer_.size()));
    loss_tokens_ += std::count(mask.begin(), mask.end(), uint8_t{1});
  }
  void flush() {
    if (buffer_.empty()) return;
    char name[64];
    std::snprintf(name, sizeof(name), "%s_%06zu.bin", prefix_.c_str(), paths_.size());
    paths_.push_back((fs::path(dir_) / name).string());
    if (with_docs_) {
      write_document_shard(paths_.back(), buffer_, mask_, offsets_, width_);
    } else {
      write_shard(paths_.back(), std::span<const int32_t>(buffer_), width_);
    }
    buffer_.clear();
    mask_.clear();
    offsets_.assign(1, 0);
  }
  int64_t total() const { return total_; }
  int64_t loss_tokens() const { return loss_tokens_; }

 private:
  std::string dir_, prefix_;
  int64_t shard_tokens_;
  bool with_docs_;
  int width_;
  std::vector<std::string>& paths_;
  std::vector<int32_t> buffer_;
  std::vector<uint8_t> mask_;        // with_docs_: one per buffered token
  std::vector<int64_t> offsets_{0};  // with_docs_: document starts in buffer_, then its end
  int64_t total_ = 0, loss_tokens_ = 0;
};

// The options are the user's command line: ConfigError, naming the flag.
void check_options(const PrepareOptions& opts, const Tokenizer& tokenizer) {
  LOOM_CONFIG_CHECK(!opts.inputs.empty(), "--input: none given");
  LOOM_CONFIG_CHECK(!opts.out_dir.empty(), "--out-dir: none given");
  LOOM_CONFIG_CHECK(opts.val_fraction >= 0 && opts.val_fraction < 1, "--val-fraction ",
                    opts.val_fraction, ": outside [0, 1)");
  LOOM_CONFIG_CHECK(opts.shard_tokens > 0 && opts.shard_tokens <= INT32_MAX, "--shard-tokens ",
                    opts.shard_tokens, ": outside [1, 2^31)");
  LOOM_CONFIG_CHECK(!tokenizer.sequence_prefix().empty() || tokenizer.eot_id() >= 0, "--tokenizer ",
                    tokenizer.source(),
                    ": names no token to start or end a document (no BOS template and no "
                    "eos_token in its tokenizer_config.json)");
  LOOM_CONFIG_CHECK(opts.chat_template.empty() || opts.format == InputFormat::kChat,
                    "--chat-template: for --format chat only");
}

void prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOOM_INPUT_CHECK(!ec && fs::is_directory(dir, ec), dir,
                   ": cannot create the output directory: ", ec ? ec.message() : "not a directory");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    LOOM_INPUT_CHECK(!is_shard_name(name), dir, ": already holds shards (", name,
                     "); remove them or choose another --out-dir");
  }
  LOOM_INPUT_CHECK(!ec, dir, ": cannot list the output directory: ", ec.message());
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

bool is_blank(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  });
}

InputFormat parse_input_format(const std::string& name) {
  if (name == "text") return InputFormat::kText;
  if (name == "fortunes") return InputFormat::kFortunes;
  if (name == "chat") return InputFormat::kChat;
  throw ConfigError("--format " + name +
                    ": unknown input format (expected text, fortunes or chat)");
}

std::vector<std::string> list_input_files(const std::vector<std::string>& inputs,
                                          InputFormat format) {
  std::vector<std::string> out;
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    LOOM_INPUT_CHECK(!ec && fs::exists(st), in, ": input does not exist");
    if (fs::is_directory(st)) {
      walk_directory(in, format, out);
    } else {
      LOOM_INPUT_CHECK(fs::is_regular_file(st), in, ": input is neither a file nor a directory");
      out.push_back(in);
    }
  }
  return out;
}

std::vector<std::string_view> split_documents(std::string_view text, InputFormat format) {
  LOOM_CHECK(format != InputFormat::kChat,
             "split_documents: chat files are split by lines (parse_conversation)");
  std::vector<std::string_view> docs;
  const auto emit = [&](std::string_view d) {
    if (!is_blank(d)) docs.push_back(d);
  };
  if (format == InputFormat::kText) {
    for (;;) {
      const size_t at = text.find(kEotText);
      emit(text.substr(0, at));
      if (at == std::string_view::npos) break;
      text.remove_prefix(at + kEotText.size());
    }
    return docs;
  }
  size_t doc_start = 0, line_start = 0;
  while (line_start < text.size()) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = text.size();
    std::string_view line = text.substr(line_start, line_end - line_start);
    if (line.ends_with('\r')) line.remove_suffix(1);
    const size_t next = std::min(line_end + 1, text.size());
    if (line == "%") {
      emit(text.substr(doc_start, line_start - doc_start));
      doc_start = next;
    }
    line_start = next;
  }
  emit(text.substr(doc_start));
  return docs;
}

int64_t val_every(double val_fraction) {
  if (val_fraction <= 0) return 0;
  return std::max<int64_t>(1, std::llround(1.0 / val_fraction));
}

namespace {

// Removes a shard and its document index, if any (cleaning up after a failed run).
void remove_shard(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
  fs::remove(docs_path_for(path), ec);
}

// Renders each non-blank line of a chat JSONL file into tokens/mask and calls
// emit(bytes of `text` consumed so far) for it. Errors name "file:line".
// Note [Parallel tokenization] for chat: each batch of kBatchDocs lines is parsed and rendered
// on every thread (each with its own renderer over its own tokenizer), and the documents are
// emitted in order; a line's error is raised in line order, so the first bad line is named
// whatever the threads.
template <typename Emit>
void chat_documents(const std::string& file, std::string_view text,
                    const std::vector<ChatRenderer*>& renderers, int64_t shard_tokens,
                    std::vector<int32_t>& tokens, std::vector<uint8_t>& mask, const Emit& emit) {
  struct Line {
    std::string_view text;
    int64_t number = 0;
    size_t end = 0;  // the input consumed once it is done
  };
  struct Doc {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> mask;
    std::exception_ptr failed;
  };
  std::vector<Line> lines;
  int64_t line_no = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (!is_blank(line)) lines.push_back({line, line_no, std::min(start, text.size())});
  }
  std::vector<Doc> docs;
  for (size_t b = 0; b < lines.size(); b += kBatchDocs) {
    const size_t n = std::min(kBatchDocs, lines.size() - b);
    docs.assign(n, Doc{});
#pragma omp parallel for schedule(dynamic, 8) num_threads(static_cast <int>(renderers.size()))
    for (int64_t k = 0; k < static_cast<int64_t>(n); ++k) {
      const Line& l = lines[b + static_cast<size_t>(k)];
      Doc& d = docs[static_cast<size_t>(k)];
      try {
        const std::string where = file + ":" + std::to_string(l.number);
        renderers[static_cast<size_t>(omp_get_thread_num())]->render(
            parse_conversation(l.text, where), d.tokens, d.mask);
        LOOM_INPUT_CHECK(static_cast<int64_t>(d.tokens.size()) <= shard_tokens, where,
                         ": the conversation is ", d.tokens.size(),
                         " tokens, more than --shard-tokens ", shard_tokens,
                         " (a document shard holds whole documents)");
      } catch (...) {
        d.failed = std::current_exception();
      }
    }
    for (size_t k = 0; k < n; ++k) {
      if (docs[k].failed) std::rethrow_exception(docs[k].failed);
      tokens.swap(docs[k].tokens);
      mask.swap(docs[k].mask);
      emit(lines[b + k].end);
    }
  }
}

// prepare_data's work, recording every shard it writes in `res` as it goes.
void prepare_into(const PrepareOptions& opts, const std::vector<std::string>& files,
                  Tokenizer& tokenizer, const std::function<void(const PrepareProgress&)>& progress,
                  PrepareResult& res) {
  const auto t0 = std::chrono::steady_clock::now();
  PrepareProgress prog;
  for (const std::string& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    LOOM_INPUT_CHECK(!ec, f, ": cannot read the input file: ", ec.message());
    prog.bytes_total += static_cast<int64_t>(size);
  }
  const bool chat = opts.format == InputFormat::kChat;
  // The chat template, as a maker of one renderer per thread's tokenizer (Note [Parallel
  // tokenization]): the model's own Jinja template, a Jinja file, or a YAML one.
  std::function<ChatRenderer(Tokenizer&)> make_renderer;
  const auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (chat && opts.chat_template.empty() && !tokenizer.chat_template().empty()) {
    make_renderer = [](Tokenizer& t) { return ChatRenderer(JinjaChatTemplate::of(t), t); };
  } else if (chat && ends_with(opts.chat_template, ".jinja")) {
    std::string source;
    const std::string why = read_whole_file(opts.chat_template, source);
    LOOM_CONFIG_CHECK(why.empty(), "--chat-template ", opts.chat_template, ": cannot read: ", why);
    const std::string path = opts.chat_template;
    make_renderer = [source, path](Tokenizer& t) {
      return ChatRenderer(JinjaChatTemplate(source, t.bos_text(), t.eos_text(), path), t);
    };
  } else if (chat) {
    const ChatTemplate tmpl = opts.chat_template.empty() ? default_chat_template()
                                                         : load_chat_template(opts.chat_template);
    make_renderer = [tmpl](Tokenizer& t) { return ChatRenderer(tmpl, t); };
  }
  prepare_out_dir(opts.out_dir);

  // uint16 tokens where the vocabulary fits them (llm.c's GPT-2 shards), else uint32.
  const int width = shard_width(tokenizer.vocab_size());
  ShardStream train(opts.out_dir, "train", opts.shard_tokens, chat, width, res.train_shards);
  ShardStream val(opts.out_dir, "val", opts.shard_tokens, chat, width, res.val_shards);
  const int64_t k = val_every(opts.val_fraction);
  // One tokenizer per thread (Note [Parallel tokenization]): the caller's and clones.
  std::vector<Tokenizer> clones;
  std::vector<Tokenizer*> workers = {&tokenizer};
  for (int t = 1; t < std::max(1, omp_get_max_threads()); ++t) clones.push_back(tokenizer.clone());
  for (Tokenizer& c : clones) workers.push_back(&c);
  std::vector<ChatRenderer> renderers;  // chat: one per worker
  std::vector<ChatRenderer*> renderer_of;
  if (chat) {
    renderers.reserve(workers.size());
    for (Tokenizer* t : workers) renderers.push_back(make_renderer(*t));
    for (ChatRenderer& r : renderers) renderer_of.push_back(&r);
  }
  std::vector<std::vector<int32_t>> batch;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;  // chat only
  int64_t last_report = 0;
  // Sends the document in `tokens` (and `mask`) to its split; `done`: input bytes consumed.
  const auto emit = [&](int64_t done) {
    const bool is_val = k > 0 && res.documents % k == 0;
    (is_val ? val : train).append(tokens, mask);
    (is_val ? res.val_documents : res.train_documents) += 1;
    ++res.documents;
    prog.tokens += static_cast<int64_t>(tokens.size());
    if (progress && done - last_report >= kProgressBytes) {
      last_report = done;
      progress({done, prog.bytes_total, res.documents, prog.tokens, seconds_since(t0)});
    }
  };
  for (const std::string& f : files) {
    const std::string text = read_input_file(f);
    // Text has no NUL bytes (git's test for binary files, over the whole file).
    const size_t nul = text.find('\0');
    LOOM_INPUT_CHECK(nul == std::string::npos, f, ": a NUL byte at offset ", nul,
                     ": a binary file, not text (prepare_data tokenizes text)");
    const auto emit_at = [&](size_t in_file) {
      emit(prog.bytes_done + static_cast<int64_t>(in_file));
    };
    if (chat) {
      chat_documents(f, text, renderer_of, opts.shard_tokens, tokens, mask, emit_at);
    } else {
      // Note [Parallel tokenization]: the documents are tokenized in batches, each document by
      // one thread with its own Tokenizer (clones: the tables shared in content, the caches
      // apart), and emitted in order, so the shards are the same bytes whatever the threads.
      const std::vector<std::string_view> docs = split_documents(text, opts.format);
      for (size_t b = 0; b < docs.size(); b += kBatchDocs) {
        const size_t n = std::min(kBatchDocs, docs.size() - b);
        batch.resize(n);
        std::vector<std::exception_ptr> failed(n);
#pragma omp parallel for schedule(dynamic, 8) num_threads(static_cast <int>(workers.size()))
        for (int64_t k = 0; k < static_cast<int64_t>(n); ++k) {
          Tokenizer& t = *workers[static_cast<size_t>(omp_get_thread_num())];
          std::vector<int32_t>& out = batch[static_cast<size_t>(k)];
          try {
            // A document: the tokenizer's template around its text (BOS for Llama), else the
            // end token before it (GPT-2's <|endoftext|> as llm.c writes it).
            const std::vector<int32_t>& before = t.sequence_prefix();
            if (before.empty())
              out.assign(1, t.eot_id());
            else
              out.assign(before.begin(), before.end());
            t.encode_append(docs[b + static_cast<size_t>(k)], /*allow_special=*/false, out);
            out.insert(out.end(), t.sequence_suffix().begin(), t.sequence_suffix().end());
          } catch (...) {
            failed[static_cast<size_t>(k)] = std::current_exception();
          }
        }
        for (size_t k = 0; k < n; ++k) {
          if (failed[k]) std::rethrow_exception(failed[k]);
          tokens.swap(batch[k]);
          const std::string_view doc = docs[b + k];
          emit_at(static_cast<size_t>(doc.data() + doc.size() - text.data()));
        }
      }
    }
    prog.bytes_done += static_cast<int64_t>(text.size());
    if (progress)
      progress({prog.bytes_done, prog.bytes_total, res.documents, prog.tokens, seconds_since(t0)});
  }
  train.flush();
  val.flush();
  if (res.train_documents == 0) {
    for (const std::string& p : res.val_shards) remove_shard(p);
  }
  LOOM_INPUT_CHECK(res.documents > 0, "prepare_data: the inputs (", files.size(),
                   " files) hold no documents: every file is empty or whitespace");
  LOOM_CONFIG_CHECK(res.train_documents > 0, "--val-fraction ", opts.val_fraction, ": all ",
                    res.documents, " documents went to val (every ", k,
                    "-th document is val); give more documents or a smaller --val-fraction");
  res.train_tokens = train.total();
  res.val_tokens = val.total();
  res.train_loss_tokens = train.loss_tokens();
  res.val_loss_tokens = val.loss_tokens();
  res.seconds = seconds_since(t0);
}

}  // namespace

PrepareResult prepare_data(const PrepareOptions& opts, Tokenizer& tokenizer,
                           const std::function<void(const PrepareProgress&)>& progress) {
  check_options(opts, tokenizer);
  const std::vector<std::string> files = list_input_files(opts.inputs, opts.format);
  LOOM_INPUT_CHECK(
      !files.empty(), "--input: the inputs hold no files to tokenize",
      opts.format == InputFormat::kChat ? " (directories give their *.jsonl files)" : "");
  // A failed run leaves nothing behind: its shards, and the output folder if it made it.
  std::error_code exists_ec;
  const bool made_dir = !fs::exists(opts.out_dir, exists_ec);
  PrepareResult res;
  try {
    prepare_into(opts, files, tokenizer, progress, res);
  } catch (...) {
    for (const auto* list : {&res.train_shards, &res.val_shards}) {
      for (const std::string& p : *list) remove_shard(p);
    }
    std::error_code ec;
    if (made_dir && fs::is_directory(opts.out_dir, ec) && fs::is_empty(opts.out_dir, ec))
      fs::remove(opts.out_dir, ec);
    throw;
  }
  return res;
}

}  // namespace loom
