// data/chat_jinja.cpp — Note [Jinja chat rendering]: a model's Jinja chat template through minja,
// the assistant turns' spans, and ChatRenderer's tokens and mask for such a template.
#include "data/chat_jinja.h"

#include <algorithm>
#include <minja.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom {

// Note [Jinja chat rendering]: the template is parsed as transformers' apply_chat_template
// parses it (trim_blocks, lstrip_blocks) and rendered with `messages` (role, content),
// `add_generation_prompt`, `bos_token` and `eos_token`; no `strftime_now` is defined, so a
// template that prints today's date (Llama 3's system header) prints its own default and the
// same data always gives the same bytes. `{% generation %}` blocks render their contents.
//   The loss covers each assistant turn: rendering the turns before it with the generation prompt
// gives P, rendering them with it gives Q, and the turn is Q's extension of P from the reply's
// content on (a template's separator before it is not the reply's) — its content and the text
// the template closes a turn with (Llama 3's <|eot_id|>, ChatML's <|im_end|>, Mistral's </s>),
// trailing whitespace left out. Each of P ⊂ Q ⊂ the whole text must hold (a template that
// rewrites earlier turns is refused, naming it). The document's tokens are the whole text's,
// special tokens recognised — the ids transformers' apply_chat_template gives, as the model sees
// them at inference (so, as there, a reply's text "<|eot_id|>" is that token; Loom's YAML
// templates keep contents as plain text). The mask is 1 from the first token not wholly before a
// turn's start to the last one reaching into it: where the text before a boundary tokenizes as
// the whole text's first tokens that is exact; where a token spans the boundary (SentencePiece
// joins a reply's first word to the space before it) that token is in.

struct JinjaChatTemplate::Impl {
  std::shared_ptr<minja::TemplateNode> root;
  std::string bos, eos, where;
};

JinjaChatTemplate::JinjaChatTemplate(const std::string& source, std::string bos, std::string eos,
                                     std::string where)
    : impl_(std::make_unique<Impl>()) {
  impl_->bos = std::move(bos);
  impl_->eos = std::move(eos);
  impl_->where = std::move(where);
  try {
    minja::Options options;
    options.trim_blocks = true;
    options.lstrip_blocks = true;
    options.keep_trailing_newline = false;
    impl_->root = minja::Parser::parse(source, options);
  } catch (const std::exception& e) {
    LOOM_INPUT_FAIL(impl_->where, ": chat_template: the template does not parse (", e.what(), ")");
  }
}

JinjaChatTemplate JinjaChatTemplate::of(const Tokenizer& tok) {
  LOOM_INPUT_CHECK(!tok.chat_template().empty(), tok.source(),
                   ": no chat_template in its tokenizer_config.json");
  return JinjaChatTemplate(tok.chat_template(), tok.bos_text(), tok.eos_text(),
                           tok.source() + " (tokenizer_config.json)");
}

JinjaChatTemplate::~JinjaChatTemplate() = default;
JinjaChatTemplate::JinjaChatTemplate(JinjaChatTemplate&&) noexcept = default;
JinjaChatTemplate& JinjaChatTemplate::operator=(JinjaChatTemplate&&) noexcept = default;

std::string JinjaChatTemplate::render(const Conversation& conv, bool add_generation_prompt,
                                      int64_t turns) const {
  const auto n = turns < 0 ? conv.size() : std::min(conv.size(), static_cast<size_t>(turns));
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (size_t k = 0; k < n; ++k)
    messages.push_back({{"role", chat_role_name(conv[k].role)}, {"content", conv[k].content}});
  auto ctx = minja::Context::make(minja::Value(nlohmann::ordered_json{
      {"messages", messages}, {"add_generation_prompt", add_generation_prompt}}));
  ctx->set("bos_token", impl_->bos);
  ctx->set("eos_token", impl_->eos);
  try {
    return impl_->root->render(ctx);
  } catch (const std::exception& e) {  // the template's raise_exception, or a render error
    LOOM_INPUT_FAIL(impl_->where, ": chat_template: ", e.what());
  }
}

std::vector<std::pair<size_t, size_t>> JinjaChatTemplate::assistant_spans(
    const Conversation& conv) const {
  const std::string full = render(conv, false);
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < conv.size(); ++i) {
    if (conv[i].role != ChatRole::kAssistant) continue;
    const std::string p = render(conv, true, static_cast<int64_t>(i));
    const std::string q = render(conv, false, static_cast<int64_t>(i + 1));
    LOOM_INPUT_CHECK(q.starts_with(p) && full.starts_with(q), impl_->where,
                     ": chat_template: the text of messages[", i,
                     "] does not extend the conversation before it (Loom finds each assistant "
                     "turn by rendering the conversation turn by turn)");
    size_t end = q.size();
    while (end > p.size() && std::isspace(static_cast<unsigned char>(q[end - 1]))) --end;
    spans.emplace_back(p.size(), end);
  }
  return spans;
}

void ChatRenderer::render_jinja(const Conversation& conv, std::vector<int32_t>& tokens,
                                std::vector<uint8_t>& mask) {
  const std::string text = jinja_->render(conv, false);
  const std::vector<std::pair<size_t, size_t>> spans = jinja_->assistant_spans(conv);
  tokens.clear();
  tokenizer_.encode_append(text, /*allow_special=*/true, tokens);
  mask.assign(tokens.size(), 0);
  // The index of the first token not wholly inside text[0, at): the tokens of the prefix where
  // they are the whole text's first ones, else where they part (a token across `at`).
  std::vector<int32_t> prefix;
  const auto boundary = [&](size_t at, bool end) {
    prefix.clear();
    tokenizer_.encode_append(std::string_view(text).substr(0, at), true, prefix);
    size_t k = 0;
    while (k < prefix.size() && k < tokens.size() && prefix[k] == tokens[k]) ++k;
    return k == prefix.size() || !end ? k : k + 1;  // an end keeps a token across it
  };
  size_t content = 0;  // the next turn's content is looked for from here
  for (size_t i = 0, a = 0; i < conv.size(); ++i) {
    if (conv[i].role != ChatRole::kAssistant) continue;
    auto [b, e] = spans[a++];
    // The span from the reply's content on (as is, else trimmed): a template's space or header
    // before it is not the reply's.
    std::string_view c = conv[i].content;
    size_t at = text.find(c, std::max(b, content));
    if (at == std::string::npos || at >= e) {
      while (!c.empty() && std::isspace(static_cast<unsigned char>(c.front()))) c.remove_prefix(1);
      at = c.empty() ? std::string::npos : text.find(c, std::max(b, content));
    }
    if (at != std::string::npos && at < e) {
      b = at;
      content = at + c.size();
    }
    const size_t first = boundary(b, false), last = std::min(boundary(e, true), tokens.size());
    for (size_t k = first; k < last; ++k) mask[k] = 1;
  }
  LOOM_INPUT_CHECK(!mask.empty() && mask[0] == 0, jinja_->where(),
                   ": chat_template: the text starts inside an assistant turn");
}

const std::string& JinjaChatTemplate::where() const { return impl_->where; }

}  // namespace loom
