// tests/data/prepare_test.cpp — prepare_data's library on a small temporary text set: document
// splitting (text and fortunes), input listing, the deterministic val split, shard sizes and
// names, and that decoding the shards gives back the documents, each after <|endoftext|>.
#include "data/prepare.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "data/loader.h"
#include "data/shard.h"
#include "tests/data/data_test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> read_shards(const std::vector<std::string>& paths) {
  std::vector<int32_t> out;
  for (const auto& p : paths) {
    ShardReader r(p);
    const std::vector<int32_t> t = r.tokens().to_vector();
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

TEST(Prepare, SplitsDocuments) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(
      split_documents("one<|endoftext|>two\n<|endoftext|>  \n<|endoftext|>", InputFormat::kText),
      (V{"one", "two\n"}));
  EXPECT_EQ(split_documents("no separator", InputFormat::kText), (V{"no separator"}));
  EXPECT_EQ(split_documents("a\nb\n%\nc %\n%\r\n\n%\nd", InputFormat::kFortunes),
            (V{"a\nb\n", "c %\n", "d"}));
  EXPECT_EQ(split_documents("%\n%\n", InputFormat::kFortunes), V{});
  EXPECT_TRUE(is_blank(""));
  EXPECT_TRUE(is_blank(" \t\r\n\v\f"));
  EXPECT_FALSE(is_blank(" \n.\n"));
  EXPECT_EQ(val_every(0.05), 20);
  EXPECT_EQ(val_every(0.3), 3);
  EXPECT_EQ(val_every(0), 0);
  EXPECT_EQ(parse_input_format("fortunes"), InputFormat::kFortunes);
  EXPECT_THROW(parse_input_format("csv"), ConfigError);
}

TEST(Prepare, ListsFortuneFiles) {
  data_test::TempDir dir;
  fs::create_directories(dir.path() / "off");
  fs::create_directories(dir.path() / "sub");
  for (const char* f : {"x", "x.dat", "off/rude", "sub/z", ".hidden"}) {
    data_test::write_bytes(dir.file(f), "q\n%\n");
  }
  fs::create_symlink(dir.path() / "x", dir.path() / "x.u8");
  fs::create_symlink(dir.path() / "x", dir.path() / "y");
  EXPECT_EQ(list_input_files({dir.path().string()}, InputFormat::kFortunes),
            (std::vector<std::string>{dir.file("sub/z"), dir.file("x")}));
  EXPECT_EQ(list_input_files({dir.path().string()}, InputFormat::kText).size(), 4u);
  EXPECT_THROW(list_input_files({dir.file("missing")}, InputFormat::kText), Error);
}

TEST(Prepare, ShardsDecodeToTheDocuments) {
  data_test::TempDir in("in"), out("out");
  const std::vector<std::string> docs = {"First doc.\n",
                                         "Second doc, with \xC3\xBCn\xC3\xAF"
                                         "code.\n",
                                         "Third.", "Fourth document, alone in its file.\n",
                                         "Fifth: 12345 and some more words to pass a shard."};
  data_test::write_bytes(in.file("a.txt"), docs[0] + "<|endoftext|>" + docs[1] + "<|endoftext|>" +
                                               docs[2] + "<|endoftext|>");
  data_test::write_bytes(in.file("b.txt"), docs[3]);
  data_test::write_bytes(in.file("c.txt"), docs[4]);
  PrepareOptions opts;
  opts.inputs = {in.file("a.txt"), in.path().string() + "/b.txt", in.file("c.txt")};
  opts.out_dir = out.file("shards");
  opts.val_fraction = 0.3;  // every round(1/0.3) = 3rd document: 0 and 3
  opts.shard_tokens = 7;
  Tokenizer tok(data_test::bpe_dir());
  int reports = 0;
  const PrepareResult r = prepare_data(opts, tok, [&](const PrepareProgress& p) {
    ++reports;
    EXPECT_LE(p.bytes_done, p.bytes_total);
  });
  EXPECT_EQ(reports, 3);  // once per file at least
  EXPECT_EQ(r.documents, 5);
  EXPECT_EQ(r.val_documents, 2);
  EXPECT_EQ(r.train_documents, 3);

  const std::string eot = "<|endoftext|>";
  const std::vector<int32_t> train = read_shards(r.train_shards), val = read_shards(r.val_shards);
  EXPECT_EQ(tok.decode(train), eot + docs[1] + eot + docs[2] + eot + docs[4]);
  EXPECT_EQ(tok.decode(val), eot + docs[0] + eot + docs[3]);
  EXPECT_EQ(static_cast<int64_t>(train.size()), r.train_tokens);
  EXPECT_EQ(static_cast<int64_t>(val.size()), r.val_tokens);
  EXPECT_EQ(std::count(train.begin(), train.end(), 50256), 3);
  ASSERT_EQ(r.train_shards.size(), static_cast<size_t>((train.size() + 6) / 7));
  EXPECT_EQ(r.train_shards[0], opts.out_dir + "/train_000000.bin");
  EXPECT_EQ(r.val_shards[1], opts.out_dir + "/val_000001.bin");
  for (size_t i = 0; i + 1 < r.train_shards.size(); ++i) {
    EXPECT_EQ(ShardReader(r.train_shards[i]).num_tokens(), 7);
  }
  DataLoader loader(r.train_shards, 1, 4, 0, 1, 0);  // the loader reads them
  EXPECT_EQ(loader.num_tokens(), r.train_tokens);

  // Re-running into the same directory is refused rather than mixing old and new shards.
  try {
    prepare_data(opts, tok);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already holds shards"), std::string::npos) << e.what();
  }
}

TEST(Prepare, DeterministicAndNoValWhenFractionIsZero) {
  data_test::TempDir in("in"), out("out");
  data_test::write_bytes(in.file("f"), "a fortune\n%\nanother one\n%\na third\n");
  PrepareOptions opts;
  opts.inputs = {in.path().string()};
  opts.format = InputFormat::kFortunes;
  opts.val_fraction = 0;
  Tokenizer tok(data_test::bpe_dir());
  opts.out_dir = out.file("1");
  const PrepareResult a = prepare_data(opts, tok);
  opts.out_dir = out.file("2");
  const PrepareResult b = prepare_data(opts, tok);
  EXPECT_TRUE(a.val_shards.empty());
  EXPECT_EQ(a.train_documents, 3);
  EXPECT_EQ(read_shards(a.train_shards), read_shards(b.train_shards));
  EXPECT_EQ(tok.decode(read_shards(a.train_shards)),
            "<|endoftext|>a fortune\n<|endoftext|>another one\n<|endoftext|>a third\n");
}

// Note [Parallel tokenization]: documents are tokenized on every thread in batches and written in
// order, so one thread and four give the same shards (more documents than one batch holds).
TEST(Prepare, TheSameShardsOnAnyNumberOfThreads) {
  data_test::TempDir in("in"), out("out");
  std::string text;
  for (int i = 0; i < 9000; ++i)
    text += "fortune " + std::to_string(i * 7919 % 10007) + (i % 3 ? " says hi\n%\n" : " é😀\n%\n");
  data_test::write_bytes(in.file("f"), text);
  PrepareOptions opts;
  opts.inputs = {in.path().string()};
  opts.format = InputFormat::kFortunes;
  Tokenizer tok(data_test::bpe_dir());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  opts.out_dir = out.file("1");
  const PrepareResult a = prepare_data(opts, tok);
  omp_set_num_threads(4);
  opts.out_dir = out.file("4");
  const PrepareResult b = prepare_data(opts, tok);
  omp_set_num_threads(threads);
  EXPECT_EQ(a.documents, 9000);
  EXPECT_EQ(read_shards(a.train_shards), read_shards(b.train_shards));
  EXPECT_EQ(read_shards(a.val_shards), read_shards(b.val_shards));
  const std::vector<int32_t> first = read_shards(a.train_shards);
  EXPECT_EQ(tok.decode(std::vector<int32_t>(first.begin(), first.begin() + 8)).substr(0, 21),
            "<|endoftext|>fortune ");
}

TEST(Prepare, AllValIsAnError) {
  data_test::TempDir in("in"), out("out");
  data_test::write_bytes(in.file("one.txt"), "just one document");
  PrepareOptions opts;
  opts.inputs = {in.file("one.txt")};
  opts.out_dir = out.path().string();
  Tokenizer tok(data_test::bpe_dir());
  try {
    prepare_data(opts, tok);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--val-fraction 0.05: all 1 documents went to val (every 20-th document is val); "
              "give more documents or a smaller --val-fraction");
  }
  EXPECT_TRUE(fs::is_empty(out.path())) << "the failed run leaves no shards behind";
}

// Inputs that are not text are named, as is input with no documents; and a failed run leaves
// no output folder behind when it made it.
TEST(Prepare, BinaryAndEmptyInputsAreNamedAndLeaveNothing) {
  data_test::TempDir in("in_bad");
  Tokenizer tok(data_test::bpe_dir());
  auto message = [&](const std::vector<std::string>& inputs, const fs::path& out) {
    PrepareOptions opts;
    opts.inputs = inputs;
    opts.out_dir = out.string();
    try {
      prepare_data(opts, tok);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  data_test::write_bytes(in.file("ok.txt"), "a document<|endoftext|>another one");
  data_test::write_bytes(in.file("b.bin"), std::string("\x7f"
                                                       "ELF\x02\x01\x00\x00",
                                                       8));
  const fs::path out = in.path() / "out";  // not there: a failed run must not leave it
  EXPECT_EQ(message({in.file("ok.txt"), in.file("b.bin")}, out),
            in.file("b.bin") +
                ": a NUL byte at offset 6: a binary file, not text (prepare_data tokenizes text)");
  EXPECT_FALSE(fs::exists(out));
  data_test::write_bytes(in.file("empty.txt"), "  \n\n ");
  EXPECT_EQ(message({in.file("empty.txt")}, out),
            "prepare_data: the inputs (1 files) hold no documents: every file is empty or "
            "whitespace");
  EXPECT_FALSE(fs::exists(out));
}

// Found by trying to break it (issue 28): user errors from prepare_data carried the source
// location ("(…/data/prepare.cpp:174)") and library text. Each is now an InputError (a file) or
// a ConfigError (an option), one line, naming the file or the flag.
TEST(Prepare, UserErrorsAreOneLineWithoutSourceLocations) {
  data_test::TempDir in("in_user");
  Tokenizer tok(data_test::bpe_dir());
  data_test::write_bytes(in.file("a.txt"), "one<|endoftext|>two<|endoftext|>three");
  data_test::write_bytes(in.file("c.jsonl"), "{\"prompt\": \"a\", \"response\": 1e999999}\n");
  const fs::path out = in.path() / "out";
  PrepareOptions base;
  base.inputs = {in.file("a.txt")};
  base.out_dir = out.string();
  // (what to change, the message, whether it is a ConfigError rather than an InputError)
  struct Case {
    std::function<void(PrepareOptions&)> change;
    std::string message;
    bool config;
  };
  const std::vector<Case> cases = {
      {[&](PrepareOptions& o) { o.inputs = {in.file("none.txt")}; },
       in.file("none.txt") + ": input does not exist", false},
      {[](PrepareOptions& o) { o.val_fraction = 2; }, "--val-fraction 2: outside [0, 1)", true},
      {[](PrepareOptions& o) { o.shard_tokens = 0; }, "--shard-tokens 0: outside [1, 2^31)", true},
      {[](PrepareOptions& o) { o.chat_template = "t.yaml"; },
       "--chat-template: for --format chat only", true},
      {[&](PrepareOptions& o) {
         o.format = InputFormat::kChat;
         o.inputs = {in.path().string()};
         o.chat_template = in.path().string();
       },
       in.path().string() + ": is a directory, not a chat template", false},
      {[&](PrepareOptions& o) {
         o.format = InputFormat::kChat;
         o.inputs = {in.file("c.jsonl")};
       },
       in.file("c.jsonl") + ":1: bad JSON: number overflow parsing '1e999999'", false},
  };
  for (const Case& c : cases) {
    PrepareOptions opts = base;
    c.change(opts);
    try {
      prepare_data(opts, tok);
      ADD_FAILURE() << c.message << ": no error";
    } catch (const InputError& e) {
      EXPECT_FALSE(c.config) << e.what();
      EXPECT_EQ(std::string(e.what()), c.message);
    } catch (const ConfigError& e) {
      EXPECT_TRUE(c.config) << e.what();
      EXPECT_EQ(std::string(e.what()), c.message);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not an InputError or ConfigError: " << e.what();
    }
    EXPECT_FALSE(fs::exists(out)) << c.message;
  }
  // A folder that already holds shards is named without a source location.
  fs::create_directories(out);
  data_test::write_bytes((out / "train_000000.bin").string(), "x");
  try {
    prepare_data(base, tok);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), out.string() +
                                         ": already holds shards (train_000000.bin); remove them "
                                         "or choose another --out-dir");
  }
}

// The tool prints one clean line for a user error: "prepare_data: <message>", no source
// location, no blank line.
TEST(Prepare, ToolPrintsOneLine) {
  data_test::TempDir dir;
  const std::string err = dir.file("stderr.txt");
  const std::string cmd = std::string(LOOM_BINARY_DIR) + "/prepare_data --bpe-dir " +
                          data_test::bpe_dir() + " --input " + dir.file("missing.txt") +
                          " --out-dir " + dir.file("out") + " >/dev/null 2>" + err;
  const int status = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  std::ifstream in(err);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "prepare_data: " + dir.file("missing.txt") + ": input does not exist\n");
}

}  // namespace
}  // namespace loom
