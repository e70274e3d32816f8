// data/chat.cpp — parsing chat JSONL lines and chat templates, and rendering a conversation into
// a document's tokens and loss mask. Every error about the user's data names "file:line" (or the
// template file) and the reason.
#include "data/chat.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/prepare.h"  // is_blank

namespace loom {
namespace {

using nlohmann::json;

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

std::string template_string(const YAML::Node& role_node, const std::string& role, const char* key,
                            const std::string& source) {
  const YAML::Node n = role_node[key];
  LOOM_INPUT_CHECK(n.IsDefined(), source, ": ", role, ".", key, ": missing");
  LOOM_INPUT_CHECK(n.IsScalar(), source, ": ", role, ".", key,
                   ": must be a string (write an empty one as \"\")");
  return n.Scalar();
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
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    LOOM_INPUT_FAIL(where, ": bad JSON: ", e.what());
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
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    LOOM_INPUT_FAIL(source, ": bad YAML: ", e.what());
  }
  LOOM_INPUT_CHECK(root.IsMap(), source,
                   ": a chat template is a map with the keys system, user and assistant");
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    LOOM_INPUT_CHECK(key == "system" || key == "user" || key == "assistant", source,
                     ": unknown key '", key, "' (expected system, user, assistant)");
    LOOM_INPUT_CHECK(kv.second.IsMap(), source, ": ", key,
                     ": must be a map with the strings prefix and suffix");
    for (const auto& field : kv.second) {
      const std::string name = field.first.as<std::string>();
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

ChatTemplate load_chat_template(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_INPUT_CHECK(in.good(), path, ": cannot open chat template");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_chat_template(text, path);
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

void ChatRenderer::render(const Conversation& conv, std::vector<int32_t>& tokens,
                          std::vector<uint8_t>& mask) {
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
