// data/chat.cpp — parsing chat JSONL lines and chat templates, and rendering a conversation into
// a document's tokens and loss mask. Every error about the user's data names "file:line" (or the
// template file) and the reason.
#include "data/chat.h"

#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/yaml_util.h"
#include "data/chat_jinja.h"
#include "data/prepare.h"  // is_blank

namespace loom {
namespace {

using nlohmann::json;

// nlohmann's message as ": reason", without its tag ("[json.exception.parse_error.101] "); a
// syntax error's "parse error at line 1, column C: " (a line is one JSON text) becomes
// " at byte C: ".
std::string json_reason(const json::exception& e) {
  std::string_view w = e.what();
  if (w.starts_with("[json.exception.")) {
    const size_t close = w.find("] ");
    if (close != std::string_view::npos) w.remove_prefix(close + 2);
  }
  if (const auto* pe = dynamic_cast<const json::parse_error*>(&e)) {
    const size_t colon = w.find(": ");
    if (w.starts_with("parse error") && colon != std::string_view::npos) {
      return " at byte " + std::to_string(pe->byte) + ": " + std::string(w.substr(colon + 2));
    }
  }
  return ": " + std::string(w);
}

// Refuses a key that an object repeats, at any depth, naming it by its path
// ("messages[1].role"): nlohmann::json keeps one of the two values, so the other would be lost
// without a word. Fed the parser's events (json::parse's callback), so no second pass is needed.
class RepeatedKeyCheck {
 public:
  explicit RepeatedKeyCheck(const std::string& where) : where_(where) {}
  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    using E = json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        next_element();
        frames_.push_back({event == E::object_start, {}, {}, -1});
        break;
      case E::object_end:
      case E::array_end:
        frames_.pop_back();
        break;
      case E::key: {
        Frame& f = frames_.back();
        f.key = parsed.get<std::string>();
        LOOM_INPUT_CHECK(f.keys.insert(f.key).second, where_, ": ", path(),
                         ": the key appears twice in one object (only one value would be kept)");
        break;
      }
      case E::value:
        next_element();
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;  // object: the keys so far
    std::string key;             // object: the current key
    int64_t index;               // array: the current element
  };
  void next_element() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
  }
  std::string path() const {
    std::string p;
    for (const Frame& f : frames_) {
      if (f.object) {
        p += (p.empty() ? "" : ".") + f.key;
      } else {
        p += "[" + std::to_string(f.index) + "]";
      }
    }
    return p;
  }
  const std::string& where_;
  std::vector<Frame> frames_;
};

// j[key] as a non-blank string; `name` is how the error calls it ("messages[1].content").
std::string content_string(const json& j, const char* key, const std::string& name,
                           const std::string& where) {
  const auto it = j.find(key);
  LOOM_INPUT_CHECK(it != j.end(), where, ": ", name, ": missing");
  LOOM_INPUT_CHECK(it->is_string(), where, ": ", name, ": must be a string, not ", it->type_name());
  std::string s = it->get<std::string>();
  LOOM_INPUT_CHECK(!is_blank(s), where, ": ", name, ": empty content");
  return s;
}

ChatRole parse_role(const json& m, const std::string& name, const std::string& where) {
  const auto it = m.find("role");
  LOOM_INPUT_CHECK(it != m.end(), where, ": ", name, ".role: missing");
  LOOM_INPUT_CHECK(it->is_string(), where, ": ", name, ".role: must be a string, not ",
                   it->type_name());
  const std::string& r = it->get_ref<const std::string&>();
  for (const ChatRole role : {ChatRole::kSystem, ChatRole::kUser, ChatRole::kAssistant}) {
    if (r == chat_role_name(role)) return role;
  }
  LOOM_INPUT_FAIL(where, ": ", name, ".role: unknown role \"", r,
                  "\" (expected system, user or assistant)");
}

// A template key as text; a key that is not a plain word (a list, a map) is named, not converted.
std::string template_key(const YAML::Node& key, const std::string& where,
                         const std::string& source) {
  LOOM_INPUT_CHECK(key.IsScalar(), source, ": ", where, "a key must be a plain word, not a ",
                   key.IsSequence() ? "list" : "map");
  return key.Scalar();
}

std::string template_string(const YAML::Node& role_node, const std::string& role, const char* key,
                            const std::string& source) {
  const YAML::Node n = role_node[key];
  LOOM_INPUT_CHECK(n.IsDefined(), source, ": ", role, ".", key, ": missing");
  LOOM_INPUT_CHECK(n.IsScalar(), source, ": ", role, ".", key,
                   ": must be a string (write an empty one as \"\")");
  return n.Scalar();
}

// The template in a parsed YAML document (parse_yaml_document has refused a second document and
// repeated keys); errors name `source` and the key.
ChatTemplate template_from_document(const YamlDocument& doc, const std::string& source) {
  LOOM_INPUT_CHECK(doc.ok(), source, ": ", doc.error);
  const YAML::Node& root = doc.root;
  LOOM_INPUT_CHECK(root.IsMap(), source,
                   ": a chat template is a map with the keys system, user and assistant");
  for (const auto& kv : root) {
    const std::string key = template_key(kv.first, "", source);
    LOOM_INPUT_CHECK(key == "system" || key == "user" || key == "assistant", source,
                     ": unknown key '", key, "' (expected system, user, assistant)");
    LOOM_INPUT_CHECK(kv.second.IsMap(), source, ": ", key,
                     ": must be a map with the strings prefix and suffix");
    for (const auto& field : kv.second) {
      const std::string name = template_key(field.first, key + ": ", source);
      LOOM_INPUT_CHECK(name == "prefix" || name == "suffix", source, ": ", key, ".", name,
                       ": unknown key (expected prefix, suffix)");
    }
  }
  ChatTemplate t;
  const std::pair<std::string, ChatTemplate::Role*> roles[] = {
      {"system", &t.system}, {"user", &t.user}, {"assistant", &t.assistant}};
  for (const auto& [name, r] : roles) {
    const YAML::Node n = root[name];
    LOOM_INPUT_CHECK(n.IsDefined(), source, ": ", name, ": missing");
    r->prefix = template_string(n, name, "prefix", source);
    r->suffix = template_string(n, name, "suffix", source);
  }
  return t;
}

}  // namespace

const char* chat_role_name(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem:
      return "system";
    case ChatRole::kUser:
      return "user";
    case ChatRole::kAssistant:
      return "assistant";
  }
  return "?";
}

Conversation parse_conversation(std::string_view line, const std::string& where) {
  json j;
  try {
    j = json::parse(line, RepeatedKeyCheck(where));
  } catch (const json::exception& e) {  // a syntax error, or a number out of range (1e999999)
    LOOM_INPUT_FAIL(where, ": bad JSON", json_reason(e));
  }
  LOOM_INPUT_CHECK(j.is_object(), where, ": a conversation must be a JSON object, not ",
                   j.type_name());
  const bool has_messages = j.contains("messages");
  const bool has_pair = j.contains("prompt") || j.contains("response");
  LOOM_INPUT_CHECK(!(has_messages && has_pair), where,
                   ": has both \"messages\" and \"prompt\"/\"response\" (use one schema)");
  Conversation conv;
  if (has_pair) {
    conv.push_back({ChatRole::kUser, content_string(j, "prompt", "prompt", where)});
    conv.push_back({ChatRole::kAssistant, content_string(j, "response", "response", where)});
    return conv;
  }
  LOOM_INPUT_CHECK(has_messages, where,
                   ": no \"messages\" key (nor \"prompt\" and \"response\"): not a conversation");
  const json& messages = j["messages"];
  LOOM_INPUT_CHECK(messages.is_array(), where, ": messages: must be an array, not ",
                   messages.type_name());
  bool has_assistant = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string name = "messages[" + std::to_string(i) + "]";
    const json& m = messages[i];
    LOOM_INPUT_CHECK(m.is_object(), where, ": ", name, ": must be an object, not ", m.type_name());
    const ChatRole role = parse_role(m, name, where);
    conv.push_back({role, content_string(m, "content", name + ".content", where)});
    has_assistant = has_assistant || role == ChatRole::kAssistant;
  }
  LOOM_INPUT_CHECK(has_assistant, where, ": no assistant turn (", messages.size(),
                   " messages): nothing to train on");
  return conv;
}

const ChatTemplate::Role& ChatTemplate::of(ChatRole role) const {
  switch (role) {
    case ChatRole::kSystem:
      return system;
    case ChatRole::kUser:
      return user;
    case ChatRole::kAssistant:
      return assistant;
  }
  LOOM_FAIL("ChatTemplate::of: bad role ", static_cast<int>(role));
}

ChatTemplate default_chat_template() {
  ChatTemplate t;
  t.system = {"System:\n", "\n"};
  t.user = {"User:\n", "\n"};
  t.assistant = {"Assistant:\n", "<|endoftext|>"};
  return t;
}

ChatTemplate parse_chat_template(const std::string& yaml_text, const std::string& source) {
  return template_from_document(parse_yaml_document(yaml_text), source);
}

ChatTemplate load_chat_template(const std::string& path) {
  return template_from_document(load_yaml_document(path, "chat template"), path);
}

// Note [Chat rendering]
// A conversation becomes one document:
//   <|endoftext|>                                  mask 0 (llm.c's BOS: every document starts so)
//   then per turn: prefix tokens                   mask 0
//                  content tokens                  mask 1 for assistant turns, else 0
//                  suffix tokens                   mask 1 for assistant turns, else 0
// so the loss covers exactly the assistant's contents and suffixes: the model learns to answer
// and, from the assistant suffix (<|endoftext|> in the default template), to stop.
// Each piece is tokenized on its own, so every mask boundary falls on a token boundary. This can
// differ from tokenizing the concatenated text where BPE would merge across a boundary (a prefix
// ending in a space would leave a lone " " token before the content, where the whole text would
// give " word"); the default template therefore ends its prefixes with a newline, after which
// GPT-2's BPE starts a fresh word anyway. A prompt at inference must be encoded the same way
// (pieces separately, ending with the assistant prefix).
// Template pieces are encoded with special tokens allowed ("<|endoftext|>" in the template is id
// 50256); contents never are (the text "<|endoftext|>" in a conversation is ordinary text, so
// data cannot inject a stop token).
ChatRenderer::ChatRenderer(const ChatTemplate& tmpl, Tokenizer& tokenizer) : tokenizer_(tokenizer) {
  for (const ChatRole role : {ChatRole::kSystem, ChatRole::kUser, ChatRole::kAssistant}) {
    Pieces& p = pieces_[static_cast<int>(role)];
    p.prefix = tokenizer.encode(tmpl.of(role).prefix, /*allow_special=*/true);
    p.suffix = tokenizer.encode(tmpl.of(role).suffix, /*allow_special=*/true);
  }
}

ChatRenderer::ChatRenderer(JinjaChatTemplate tmpl, Tokenizer& tokenizer)
    : jinja_(std::make_unique<JinjaChatTemplate>(std::move(tmpl))), tokenizer_(tokenizer) {}

ChatRenderer::~ChatRenderer() = default;
ChatRenderer::ChatRenderer(ChatRenderer&&) noexcept = default;

void ChatRenderer::render(const Conversation& conv, std::vector<int32_t>& tokens,
                          std::vector<uint8_t>& mask) {
  if (jinja_) {
    render_jinja(conv, tokens, mask);
    return;
  }
  tokens.assign(1, tokenizer_.eot_id());
  mask.assign(1, 0);
  for (const ChatTurn& turn : conv) {
    const Pieces& p = pieces_[static_cast<int>(turn.role)];
    const uint8_t target = turn.role == ChatRole::kAssistant ? 1 : 0;
    tokens.insert(tokens.end(), p.prefix.begin(), p.prefix.end());
    mask.resize(tokens.size(), 0);
    tokenizer_.encode_append(turn.content, /*allow_special=*/false, tokens);
    tokens.insert(tokens.end(), p.suffix.begin(), p.suffix.end());
    mask.resize(tokens.size(), target);
  }
}

}  // namespace loom
