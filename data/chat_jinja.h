// data/chat_jinja.h — a Hugging Face model's own chat template (tokenizer_config.json's Jinja
// `chat_template`) rendered with minja (data/minja, Google's header-only Jinja engine): a
// conversation's text as transformers' apply_chat_template writes it, and a document's tokens
// with the loss mask on the assistant's turns (Note [Jinja chat rendering] in
// data/chat_jinja.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/chat.h"
#include "data/tokenizer.h"

namespace loom {

class JinjaChatTemplate {
 public:
  // `source`: the template; bos/eos: the texts its bos_token and eos_token stand for; `where`
  // names it in errors (the tokenizer_config.json). A template that does not parse is a
  // loom::InputError naming `where` and the reason.
  JinjaChatTemplate(const std::string& source, std::string bos, std::string eos, std::string where);
  // The tokenizer's own template (Tokenizer::chat_template(); InputError when it has none).
  static JinjaChatTemplate of(const Tokenizer& tok);
  ~JinjaChatTemplate();
  JinjaChatTemplate(JinjaChatTemplate&&) noexcept;
  JinjaChatTemplate& operator=(JinjaChatTemplate&&) noexcept;

  // The text of the first `turns` turns of `conv` (all when -1), with the template's prompt for
  // an assistant reply after them when add_generation_prompt (apply_chat_template's text).
  std::string render(const Conversation& conv, bool add_generation_prompt,
                     int64_t turns = -1) const;
  // Where each assistant turn lies in render(conv, false): [begin, end) byte ranges, its content
  // and the end-of-turn text the template closes it with (trailing whitespace left out).
  std::vector<std::pair<size_t, size_t>> assistant_spans(const Conversation& conv) const;
  const std::string& where() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom
