// tests/data/chat_test.cpp — chat/instruction data (data/chat.h, prepare_data --format chat):
// parsing both JSONL schemas and naming every kind of bad line, the template file (the shipped one
// is the built-in default; unknown and missing keys named), rendering (the loss-masked tokens
// decode to exactly the assistant contents and suffixes), and prepare_data on the shipped sample
// (data/samples/chat_sample.jsonl): every conversation is a document of the written shards.
#include "data/chat.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/chat_jinja.h"
#include "data/documents.h"
#include "data/prepare.h"
#include "tests/data/data_test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string sample_path() {
  return (data_test::source_root() / "data" / "samples" / "chat_sample.jsonl").string();
}

// The message of the loom::InputError that f throws ("no error" if none).
template <typename F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

std::string decode(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  return tok.decode(ids);
}

// The tokens whose mask equals `want`, in order.
std::vector<int32_t> where_mask(std::span<const int32_t> tokens, std::span<const uint8_t> mask,
                                uint8_t want) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (mask[i] == want) out.push_back(tokens[i]);
  }
  return out;
}

TEST(Chat, ParsesBothSchemas) {
  const Conversation c = parse_conversation(
      R"({"id": 7, "messages": [{"role": "system", "content": "Be brief."},)"
      R"( {"role": "user", "content": "Hi?", "name": "x"}, {"role": "assistant", "content": "Hello."}]})",
      "f:1");
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].role, ChatRole::kSystem);
  EXPECT_EQ(c[0].content, "Be brief.");
  EXPECT_EQ(c[1].role, ChatRole::kUser);
  EXPECT_EQ(c[1].content, "Hi?");
  EXPECT_EQ(c[2].role, ChatRole::kAssistant);
  EXPECT_EQ(c[2].content, "Hello.");
  const Conversation p = parse_conversation(R"({"prompt": "2+2?", "response": " 4\n"})", "f:2");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].role, ChatRole::kUser);
  EXPECT_EQ(p[0].content, "2+2?");
  EXPECT_EQ(p[1].role, ChatRole::kAssistant);
  EXPECT_EQ(p[1].content, " 4\n");  // kept byte for byte
}

TEST(Chat, NamesEveryBadLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"messages": [)", "bad JSON at byte 15: syntax error while parsing value"},
      {R"([1, 2])", "a conversation must be a JSON object, not array"},
      {R"({"text": "hi"})", "no \"messages\" key (nor \"prompt\" and \"response\")"},
      {R"({"messages": "hi"})", "messages: must be an array, not string"},
      {R"({"messages": [3]})", "messages[0]: must be an object, not number"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role: missing"},
      {R"({"messages": [{"role": 1, "content": "x"}]})",
       "messages[0].role: must be a string, not number"},
      {R"({"messages": [{"role": "assistant", "content": "a"}, {"role": "bot", "content": "x"}]})",
       "messages[1].role: unknown role \"bot\" (expected system, user or assistant)"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content: missing"},
      {R"({"messages": [{"role": "user", "content": ["x"]}]})",
       "messages[0].content: must be a string, not array"},
      {R"({"messages": [{"role": "assistant", "content": " \n"}]})",
       "messages[0].content: empty content"},
      {R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]})",
       "no assistant turn (2 messages): nothing to train on"},
      {R"({"messages": []})", "no assistant turn (0 messages)"},
      {R"({"prompt": "p"})", "response: missing"},
      {R"({"response": "r"})", "prompt: missing"},
      {R"({"prompt": "p", "response": ""})", "response: empty content"},
      {R"({"prompt": "p", "response": 5})", "response: must be a string, not number"},
      {R"({"prompt": "p", "response": "r", "messages": []})",
       "has both \"messages\" and \"prompt\"/\"response\""},
  };
  for (const auto& [line, fragment] : cases) {
    const std::string msg = input_error([&] { parse_conversation(line, "data/x.jsonl:12"); });
    EXPECT_EQ(msg.rfind("data/x.jsonl:12: ", 0), 0u) << line << " -> " << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << line << " -> " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}

// Found by trying to break it (issue 28): a number JSON cannot hold, nlohmann's tagged exception
// text, and keys given twice (nlohmann::json keeps one value, so the other was lost silently).
TEST(Chat, RepeatedKeysAndBadNumbersAreNamedInLoomsWords) {
  const std::string a = R"({"role": "assistant", "content": "b"})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": "a", "response": 1e999999})", "bad JSON: number overflow parsing '1e999999'"},
      {R"({"prompt": x})", "bad JSON at byte 12: syntax error while parsing value"},
      {R"({"prompt": "a", "prompt": "b", "response": "c"})",
       "prompt: the key appears twice in one object"},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "role": "user",)"
       R"( "content": "b"}]})",
       "messages[1].role: the key appears twice in one object"},
      {R"({"messages": [)" + a + R"(, {"role": "user", "content": "a", "content": "b"}]})",
       "messages[1].content: the key appears twice"},
      {R"({"id": {"n": [1, {"k": 1, "k": 2}]}, "prompt": "a", "response": "b"})",
       "id.n[1].k: the key appears twice"},
      {R"({"messages": [)" + a + R"(], "messages": []})", "messages: the key appears twice"},
  };
  for (const auto& [line, fragment] : cases) {
    const std::string msg = input_error([&] { parse_conversation(line, "data/x.jsonl:12"); });
    EXPECT_EQ(msg.rfind("data/x.jsonl:12: ", 0), 0u) << line << " -> " << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << line << " -> " << msg;
    EXPECT_EQ(msg.find("json.exception"), std::string::npos) << "library text: " << msg;
    EXPECT_EQ(msg.find(".cpp"), std::string::npos) << "source location: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
  // The same key in two objects is fine.
  EXPECT_EQ(
      parse_conversation(R"({"messages": [{"role": "user", "content": "a"}, )" + a + "]}", "f:1")
          .size(),
      2u);
}

// Found by trying to break it (issue 28): a directory given as the template, a key that is not a
// plain word, a key given twice, and a second YAML document (silently ignored before).
TEST(Chat, TemplateRefusesRepeatedKeysSecondDocumentsAndOddKeys) {
  const std::string roles =
      "system: {prefix: 'S ', suffix: ''}\nuser: {prefix: 'U ', suffix: ''}\n"
      "assistant: {prefix: 'A ', suffix: ''}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {roles + "assistant: {prefix: 'B ', suffix: ''}\n",
       "t.yaml: assistant: the key appears twice (lines 3 and 4; the first value would win)"},
      {"system: {prefix: a, suffix: b, prefix: c}\n",
       "t.yaml: system.prefix: the key appears twice"},
      {roles + "---\nuser: {prefix: 'V ', suffix: ''}\n",
       "t.yaml: a second YAML document starts at line 5 (after '---')"},
      {roles + "? [a, b]\n: c\n", "t.yaml: a key must be a plain word, not a list"},
      {"system: {? {a: 1} : b}\n", "t.yaml: system: a key must be a plain word, not a map"},
      {"user: {prefix: 'a\n", "t.yaml: malformed YAML at line"},
  };
  for (const auto& [text, fragment] : cases) {
    const std::string msg = input_error([&] { parse_chat_template(text, "t.yaml"); });
    EXPECT_EQ(msg.rfind(fragment, 0), 0u) << text << " -> " << msg;
    EXPECT_EQ(msg.find("yaml-cpp"), std::string::npos) << "library text: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
  // A trailing "---" (an empty second document) drops nothing: accepted.
  EXPECT_EQ(parse_chat_template(roles + "---\n", "t.yaml").assistant.prefix, "A ");

  data_test::TempDir dir;
  EXPECT_EQ(input_error([&] { load_chat_template(dir.path().string()); }),
            dir.path().string() + ": is a directory, not a chat template");
  EXPECT_EQ(input_error([] { load_chat_template("/nonexistent/t.yaml"); }),
            "/nonexistent/t.yaml: cannot read the chat template: No such file or directory");
  data_test::write_bytes(dir.file("t.yaml"), roles + "---\nuser: {prefix: x, suffix: y}\n");
  EXPECT_EQ(input_error([&] {
              load_chat_template(dir.file("t.yaml"));
            }).rfind(dir.file("t.yaml") + ": a second YAML document starts at line 5", 0),
            0u);
}

TEST(Chat, ShippedTemplateIsTheDefault) {
  const std::string path = (data_test::source_root() / "configs" / "chat_template.yaml").string();
  const ChatTemplate t = load_chat_template(path);
  EXPECT_EQ(t, default_chat_template());
  EXPECT_EQ(t.user.prefix, "User:\n");
  EXPECT_EQ(t.user.suffix, "\n");
  EXPECT_EQ(t.assistant.prefix, "Assistant:\n");
  EXPECT_EQ(t.assistant.suffix, "<|endoftext|>");
  EXPECT_EQ(t.system.prefix, "System:\n");
}

TEST(Chat, TemplateErrorsNameTheKey) {
  const std::string ok_roles =
      "system: {prefix: 'S ', suffix: ''}\nuser: {prefix: 'U ', suffix: ''}\n";
  const ChatTemplate t =
      parse_chat_template(ok_roles + "assistant: {prefix: 'A ', suffix: \"!\\n\"}\n", "t.yaml");
  EXPECT_EQ(t.system.prefix, "S ");
  EXPECT_EQ(t.user.suffix, "");
  EXPECT_EQ(t.assistant.suffix, "!\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {ok_roles + "assistant: {prefix: a, suffix: b}\ntool: {prefix: a, suffix: b}\n",
       "t.yaml: unknown key 'tool' (expected system, user, assistant)"},
      {ok_roles + "assistant: {prefix: a, suffx: b}\n",
       "t.yaml: assistant.suffx: unknown key (expected prefix, suffix)"},
      {ok_roles + "assistant: {prefix: a}\n", "t.yaml: assistant.suffix: missing"},
      {ok_roles, "t.yaml: assistant: missing"},
      {ok_roles + "assistant: {prefix: a, suffix: [b]}\n",
       "t.yaml: assistant.suffix: must be a string"},
      {ok_roles + "assistant: {prefix: a, suffix: }\n",
       "t.yaml: assistant.suffix: must be a string"},
      {ok_roles + "assistant: text\n", "t.yaml: assistant: must be a map"},
      {"- 1\n- 2\n", "t.yaml: a chat template is a map"},
      {"user: {prefix: 'a\n", "t.yaml: malformed YAML"},
  };
  for (const auto& [text, fragment] : cases) {
    const std::string msg = input_error([&] { parse_chat_template(text, "t.yaml"); });
    EXPECT_NE(msg.find(fragment), std::string::npos) << text << " -> " << msg;
  }
}

TEST(Chat, LossMaskCoversExactlyTheAssistantTurns) {
  Tokenizer tok(data_test::bpe_dir());
  ChatTemplate tmpl = default_chat_template();
  tmpl.system = {"<sys> ", " </sys>"};
  ChatRenderer renderer(tmpl, tok);
  const Conversation conv = {
      {ChatRole::kSystem, "Answer in words."},
      {ChatRole::kUser, "What is 2 + 2?"},
      {ChatRole::kAssistant, "Four, written <|endoftext|> as text."},
      {ChatRole::kUser, "And 3 + 3?"},
      {ChatRole::kAssistant, "Six."},
  };
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  renderer.render(conv, tokens, mask);
  ASSERT_EQ(tokens.size(), mask.size());
  const std::string eot = "<|endoftext|>";
  // The whole document, and the trained part alone.
  EXPECT_EQ(decode(tok, tokens), eot + "<sys> Answer in words. </sys>User:\nWhat is 2 + 2?\n" +
                                     "Assistant:\nFour, written <|endoftext|> as text." + eot +
                                     "User:\nAnd 3 + 3?\nAssistant:\nSix." + eot);
  EXPECT_EQ(decode(tok, where_mask(tokens, mask, 1)),
            "Four, written <|endoftext|> as text." + eot + "Six." + eot);
  EXPECT_EQ(tokens[0], 50256);
  EXPECT_EQ(mask[0], 0);
  EXPECT_EQ(tokens.back(), 50256);  // the assistant suffix is the special token, and trained
  EXPECT_EQ(mask.back(), 1);
  // <|endoftext|> in content is text: the document holds the special token 3 times (BOS and the
  // two assistant suffixes), not 4.
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), 50256), 3);
  // The trained tokens are the pieces tokenized on their own.
  std::vector<int32_t> want = tok.encode(conv[2].content);
  want.push_back(50256);
  for (const int32_t t : tok.encode(conv[4].content)) want.push_back(t);
  want.push_back(50256);
  EXPECT_EQ(where_mask(tokens, mask, 1), want);
  // Rendering again replaces, not appends.
  renderer.render({{ChatRole::kUser, "x"}, {ChatRole::kAssistant, "y"}}, tokens, mask);
  EXPECT_EQ(decode(tok, tokens), eot + "User:\nx\nAssistant:\ny" + eot);
  EXPECT_EQ(std::vector<uint8_t>(mask.end() - 2, mask.end()), (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(std::count(mask.begin(), mask.end(), 1), 2);
}

TEST(Chat, PromptResponseIsTheMessagesForm) {
  Tokenizer tok(data_test::bpe_dir());
  ChatRenderer renderer(default_chat_template(), tok);
  std::vector<int32_t> t1, t2;
  std::vector<uint8_t> m1, m2;
  renderer.render(parse_conversation(R"({"prompt": "Sort: 3 1 2", "response": "1 2 3"})", "a:1"),
                  t1, m1);
  renderer.render(parse_conversation(R"({"messages": [{"role": "user", "content": "Sort: 3 1 2"},)"
                                     R"( {"role": "assistant", "content": "1 2 3"}]})",
                                     "a:2"),
                  t2, m2);
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(decode(tok, where_mask(t1, m1, 1)), "1 2 3<|endoftext|>");
}

PrepareOptions chat_options(const std::vector<std::string>& inputs, const std::string& out) {
  PrepareOptions opts;
  opts.inputs = inputs;
  opts.out_dir = out;
  opts.format = InputFormat::kChat;
  return opts;
}

TEST(Chat, PrepareNamesFileAndLine) {
  data_test::TempDir in("in");
  Tokenizer tok(data_test::bpe_dir());
  const std::string good = R"({"prompt": "a", "response": "b"})";
  data_test::write_bytes(in.file("a.jsonl"), good + "\n\n" + good + "\r\n" +
                                                 R"({"prompt": "a", "response": 1})" + "\n");
  const fs::path out = in.path() / "out";
  const std::string msg =
      input_error([&] { prepare_data(chat_options({in.file("a.jsonl")}, out.string()), tok); });
  EXPECT_EQ(msg, in.file("a.jsonl") + ":4: response: must be a string, not number");
  EXPECT_FALSE(fs::exists(out)) << "a failed run leaves no output folder";

  // A conversation longer than a shard is named too.
  data_test::write_bytes(in.file("a.jsonl"), good + "\n" + good + "\n" +
                                                 R"({"prompt": "a b c d e f g", "response": "b"})");
  PrepareOptions opts = chat_options({in.file("a.jsonl")}, out.string());
  opts.shard_tokens = 12;
  const std::string long_msg = input_error([&] { prepare_data(opts, tok); });
  EXPECT_EQ(long_msg.rfind(in.file("a.jsonl") + ":3: the conversation is ", 0), 0u) << long_msg;
  EXPECT_NE(long_msg.find("more than --shard-tokens 12"), std::string::npos) << long_msg;
  EXPECT_FALSE(fs::exists(out));

  // A template with another format is refused.
  opts = chat_options({in.file("a.jsonl")}, out.string());
  opts.format = InputFormat::kText;
  opts.chat_template = "configs/chat_template.yaml";
  EXPECT_THROW(prepare_data(opts, tok), ConfigError);
  EXPECT_EQ(parse_input_format("chat"), InputFormat::kChat);
}

// --chat-template FILE.jinja: a Hugging Face template from a file (for a model whose
// tokenizer_config.json has none), rendered with the tokenizer's bos and eos; the document is
// what ChatRenderer makes of it, its mask the reply and end-of-turn text. An unreadable file is
// named.
TEST(Chat, PrepareTakesAJinjaTemplateFile) {
  data_test::TempDir in("jinja");
  Tokenizer tok(data_test::bpe_dir());
  const std::string source =
      "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
      "'<|endoftext|>' }}{% endfor %}";
  data_test::write_bytes(in.file("t.jinja"), source);
  data_test::write_bytes(in.file("a.jsonl"), R"({"prompt": "Hi there", "response": "Hello!"})");
  PrepareOptions opts = chat_options({in.file("a.jsonl")}, in.file("out"));
  opts.chat_template = in.file("t.jinja");
  opts.val_fraction = 0;
  const PrepareResult r = prepare_data(opts, tok);
  ASSERT_EQ(r.train_shards.size(), 1u);
  const DocumentReader d(r.train_shards[0]);
  ASSERT_EQ(d.num_docs(), 1);
  std::vector<int32_t> want;
  std::vector<uint8_t> want_mask;
  ChatRenderer(JinjaChatTemplate(source, tok.bos_text(), tok.eos_text(), "t"), tok)
      .render({{ChatRole::kUser, "Hi there"}, {ChatRole::kAssistant, "Hello!"}}, want, want_mask);
  const std::vector<int32_t> ids = d.doc_tokens(0).to_vector();
  EXPECT_EQ(ids, want);
  EXPECT_EQ(decode(tok, where_mask(ids, d.doc_mask(0), 1)), "Hello!<|endoftext|>");
  opts.chat_template = in.file("missing.jinja");
  opts.out_dir = in.file("out2");
  try {
    prepare_data(opts, tok);
    FAIL() << "an unreadable template must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(in.file("missing.jinja")), std::string::npos) << e.what();
  }
}

// Note [Parallel tokenization] for chat: one thread and four give the same document shards
// (tokens and masks) with the YAML template and a Jinja one, and a bad line late in the file is
// the one named either way.
TEST(Chat, TheSameShardsOnAnyNumberOfThreads) {
  data_test::TempDir out("threads");
  Tokenizer tok(data_test::bpe_dir());
  const std::string jinja =
      (data_test::source_root() / "tests" / "data" / "testdata" / "chat_templates" / "llama3.jinja")
          .string();
  // Every document of the shards: its tokens and its mask, in order.
  const auto documents = [](const PrepareResult& r) {
    std::vector<std::pair<std::vector<int32_t>, std::vector<uint8_t>>> all;
    for (const auto* list : {&r.train_shards, &r.val_shards}) {
      for (const std::string& p : *list) {
        const DocumentReader d(p);
        for (int64_t k = 0; k < d.num_docs(); ++k) {
          const auto m = d.doc_mask(k);
          all.emplace_back(d.doc_tokens(k).to_vector(), std::vector<uint8_t>(m.begin(), m.end()));
        }
      }
    }
    return all;
  };
  const int threads = omp_get_max_threads();
  for (const std::string& tmpl : {std::string(), jinja}) {
    SCOPED_TRACE(tmpl.empty() ? "yaml" : "jinja");
    PrepareOptions opts = chat_options({sample_path()}, out.file("1"));
    opts.chat_template = tmpl;
    omp_set_num_threads(1);
    const PrepareResult a = prepare_data(opts, tok);
    omp_set_num_threads(4);
    opts.out_dir = out.file("4");
    const PrepareResult b = prepare_data(opts, tok);
    omp_set_num_threads(threads);
    EXPECT_EQ(a.documents, 3000);
    EXPECT_EQ(documents(a), documents(b));
    fs::remove_all(out.file("1"));
    fs::remove_all(out.file("4"));
  }
  // Lines 2000 and 2500 bad: line 2000 is named on any number of threads.
  data_test::TempDir in("bad");
  std::string text;
  for (int i = 1; i <= 3000; ++i)
    text += i == 2000 || i == 2500 ? std::string(R"({"prompt": 1})") + "\n"
                                   : R"({"prompt": "a", "response": "b"})" + std::string("\n");
  data_test::write_bytes(in.file("c.jsonl"), text);
  for (int n : {1, 4}) {
    omp_set_num_threads(n);
    const std::string msg = input_error(
        [&] { prepare_data(chat_options({in.file("c.jsonl")}, out.file("bad")), tok); });
    omp_set_num_threads(threads);
    EXPECT_EQ(msg.rfind(in.file("c.jsonl") + ":2000: ", 0), 0u) << msg;
  }
}

TEST(Chat, DirectoriesGiveTheirJsonlFiles) {
  data_test::TempDir in;
  for (const char* f : {"b.jsonl", "a.jsonl", "README.md", "c.json"}) {
    data_test::write_bytes(in.file(f), "{}\n");
  }
  EXPECT_EQ(list_input_files({in.path().string()}, InputFormat::kChat),
            (std::vector<std::string>{in.file("a.jsonl"), in.file("b.jsonl")}));
}

// The assistant contents of one JSONL conversation, each followed by <|endoftext|>, read with
// nlohmann::json directly (not through parse_conversation).
std::string assistant_text(const std::string& line) {
  const nlohmann::json j = nlohmann::json::parse(line);
  std::string out;
  if (j.contains("response")) return j["response"].get<std::string>() + "<|endoftext|>";
  for (const auto& m : j["messages"]) {
    if (m["role"] == "assistant") {
      out += m["content"].get<std::string>();
      out += "<|endoftext|>";
    }
  }
  return out;
}

TEST(Chat, PrepareOnTheShippedSample) {
  std::vector<std::string> lines;
  {
    std::ifstream in(sample_path());
    ASSERT_TRUE(in.good()) << sample_path();
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(line);
    }
  }
  ASSERT_GE(lines.size(), 2000u);
  data_test::TempDir out;
  Tokenizer tok(data_test::bpe_dir());
  PrepareOptions opts = chat_options({sample_path()}, out.file("sft"));
  opts.val_fraction = 0.05;  // every 20th conversation
  opts.shard_tokens = 50'000;
  const PrepareResult r = prepare_data(opts, tok);
  EXPECT_EQ(r.documents, static_cast<int64_t>(lines.size()));
  EXPECT_EQ(r.val_documents, static_cast<int64_t>((lines.size() + 19) / 20));
  ASSERT_GE(r.train_shards.size(), 2u) << "the sample should span several 50k-token shards";

  // Documents in shard order: train's, then val's.
  std::vector<DocumentReader> readers;
  int64_t train_tokens = 0, train_loss = 0, val_loss = 0;
  for (const auto* list : {&r.train_shards, &r.val_shards}) {
    for (const std::string& p : *list) {
      ASSERT_TRUE(has_document_index(p)) << p;
      readers.emplace_back(p);
      const DocumentReader& d = readers.back();
      EXPECT_LE(d.num_tokens(), opts.shard_tokens) << p;
      EXPECT_NO_THROW(d.check_vocab(tok.vocab_size()));
      (list == &r.train_shards ? train_loss : val_loss) += d.num_loss_tokens();
      if (list == &r.train_shards) train_tokens += d.num_tokens();
    }
  }
  EXPECT_EQ(train_tokens, r.train_tokens);
  EXPECT_EQ(train_loss, r.train_loss_tokens);
  EXPECT_EQ(val_loss, r.val_loss_tokens);
  EXPECT_GT(r.train_loss_tokens, 0);
  EXPECT_LT(r.train_loss_tokens, r.train_tokens);

  // Conversation i is val when i % 20 == 0; each split keeps the input order.
  std::vector<std::pair<const DocumentReader*, int64_t>> train_order, val_order;
  for (const DocumentReader& d : readers) {
    const bool is_val = d.path().find("/val_") != std::string::npos;
    for (int64_t k = 0; k < d.num_docs(); ++k)
      (is_val ? val_order : train_order).push_back({&d, k});
  }
  ASSERT_EQ(train_order.size() + val_order.size(), lines.size());
  size_t next_train = 0, next_val = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto [reader, k] = i % 20 == 0 ? val_order[next_val++] : train_order[next_train++];
    const auto t = reader->doc_tokens(k);
    const auto m = reader->doc_mask(k);
    const std::vector<int32_t> ids = t.to_vector();
    ASSERT_EQ(ids.front(), 50256) << "conversation " << i;
    ASSERT_EQ(decode(tok, where_mask(ids, m, 1)), assistant_text(lines[i]))
        << "conversation " << i << ": " << lines[i];
  }
}

TEST(Chat, TextFormatsWriteNoDocumentIndex) {
  data_test::TempDir in("in"), out("out");
  data_test::write_bytes(in.file("a.txt"), "one<|endoftext|>two<|endoftext|>three");
  PrepareOptions opts;
  opts.inputs = {in.file("a.txt")};
  opts.out_dir = out.path().string();
  opts.val_fraction = 0;
  Tokenizer tok(data_test::bpe_dir());
  const PrepareResult r = prepare_data(opts, tok);
  ASSERT_EQ(r.train_shards.size(), 1u);
  EXPECT_FALSE(has_document_index(r.train_shards[0]));
  EXPECT_EQ(r.train_loss_tokens, 0);
}

}  // namespace
}  // namespace loom
