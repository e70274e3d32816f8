// data/chat.h — chat/instruction (SFT) data for prepare_data --format chat: one conversation per
// JSONL line (parse_conversation), a chat template read from YAML (load_chat_template), and the
// rendering of a conversation into a document's tokens and loss mask (ChatRenderer). Nothing here
// writes files; data/prepare.cpp streams the rendered documents into document shards
// (data/documents.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace loom {

class JinjaChatTemplate;  // data/chat_jinja.h

enum class ChatRole { kSystem, kUser, kAssistant };
const char* chat_role_name(ChatRole role);  // "system" | "user" | "assistant"

struct ChatTurn {
  ChatRole role;
  std::string content;
};
using Conversation = std::vector<ChatTurn>;

// Parses one JSONL line: {"messages": [{"role": "system"|"user"|"assistant", "content": "..."},
// ...]} or {"prompt": "...", "response": "..."} (= a user turn then an assistant turn). Other keys
// are ignored. Refused (loom::InputError "<where>: reason", where is "file:line"): bad JSON (a
// syntax error named by its byte, or a number out of range), a key repeated in one object at any
// depth (named by its path, "messages[1].role"), not an object, both or neither schema, a missing
// or ill-typed key, an unknown role, empty content, no assistant turn.
Conversation parse_conversation(std::string_view line, const std::string& where);

// The text around each turn. Note [Chat rendering] in data/chat.cpp says how a conversation
// becomes tokens and a loss mask.
struct ChatTemplate {
  struct Role {
    std::string prefix, suffix;
    bool operator==(const Role&) const = default;
  };
  Role system, user, assistant;
  bool operator==(const ChatTemplate&) const = default;
  const Role& of(ChatRole role) const;
};

// The built-in template, the same as the shipped configs/chat_template.yaml:
//   system "System:\n" … "\n", user "User:\n" … "\n", assistant "Assistant:\n" … "<|endoftext|>".
ChatTemplate default_chat_template();
// A YAML template: keys system, user and assistant, each a map with the strings prefix and suffix
// (all six required; unknown keys refused, named). Read as the run config is (core/yaml_util.h):
// one document, each key once. `source` names the text in errors (loom::InputError).
ChatTemplate parse_chat_template(const std::string& yaml_text, const std::string& source);
ChatTemplate load_chat_template(const std::string& path);

// Renders conversations with one template and tokenizer (the template's pieces are encoded once).
// Holds a reference to the tokenizer, which must outlive it.
class ChatRenderer {
 public:
  ChatRenderer(const ChatTemplate& tmpl, Tokenizer& tokenizer);
  // A model's own Jinja template (Note [Jinja chat rendering] in data/chat_jinja.cpp).
  ChatRenderer(JinjaChatTemplate tmpl, Tokenizer& tokenizer);
  ~ChatRenderer();
  ChatRenderer(ChatRenderer&&) noexcept;
  // Replaces tokens and mask with the conversation's document (Note [Chat rendering]).
  void render(const Conversation& conv, std::vector<int32_t>& tokens, std::vector<uint8_t>& mask);

 private:
  void render_jinja(const Conversation& conv, std::vector<int32_t>& tokens,
                    std::vector<uint8_t>& mask);  // data/chat_jinja.cpp
  std::unique_ptr<JinjaChatTemplate> jinja_;
  struct Pieces {
    std::vector<int32_t> prefix, suffix;
  };
  Pieces pieces_[3];  // by ChatRole
  Tokenizer& tokenizer_;
};

}  // namespace loom
