// core/yaml_util.h — reading YAML the one way Loom does, for the run config (train/config.cpp)
// and the chat template (data/chat.cpp): one document per file (text after a second "---" is
// refused, not silently dropped), every mapping key given once at every depth (yaml-cpp keeps
// both entries of a repeated key and reads the first, so the second value would be ignored
// without a word), and every failure one line in Loom's words, never yaml-cpp's exception text.
// Nothing here throws for bad input: it returns what is wrong, and the caller names the file and
// picks the error type (ConfigError for a config, InputError for a data file).
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace loom {

struct YamlDocument {
  YAML::Node root;    // the document (a null node for empty text); meaningful when ok()
  std::string error;  // why the text is refused, one line without the file's name; "" when ok
  bool ok() const { return error.empty(); }
};

// Parses `text`, which must hold one YAML document (empty documents after it, as left by a
// trailing "---", are allowed: they hold nothing that would be dropped), with no repeated key
// in any mapping. Errors: "malformed YAML at line L: <reason>", "a second YAML document starts
// at line L (after '---'): ...", "model.n_layer: the key appears twice (lines 3 and 5; ...)".
YamlDocument parse_yaml_document(const std::string& text);

// The same for the file at `path`; `what` names it in errors ("config file", "chat template"):
// "is a directory, not a <what>", "cannot read the <what>: <reason>".
YamlDocument load_yaml_document(const std::string& path, const std::string& what);

}  // namespace loom
