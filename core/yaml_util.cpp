// core/yaml_util.cpp — parse_yaml_document / load_yaml_document: one document, no repeated
// keys, errors as returned lines (core/yaml_util.h).
#include "core/yaml_util.h"

#include <filesystem>
#include <map>

#include "core/read_file.h"

namespace loom {
namespace {

// " at line N", or "" where yaml-cpp gives no position.
std::string at_line(const YAML::Mark& m) {
  return m.is_null() ? "" : " at line " + std::to_string(m.line + 1);
}

// The first key that a mapping repeats, anywhere under `node`, as "path: the key appears twice
// (...)"; "" when there is none. `path` is the node's dotted path ("" for the root); sequence
// items are "[i]". Keys that are not scalars are compared by no one here: the callers refuse them.
std::string find_repeated_key(const YAML::Node& node, const std::string& path, int depth) {
  if (depth > 100) return "";  // no real config nests so deep; yaml-cpp refuses cycles itself
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      std::string item = path;
      item.append(1, '[').append(std::to_string(i)).append(1, ']');
      std::string e = find_repeated_key(node[i], item, depth + 1);
      if (!e.empty()) return e;
    }
  }
  if (!node.IsMap()) return "";
  std::map<std::string, YAML::Mark> seen;
  for (const auto& kv : node) {
    if (kv.first.IsScalar()) {
      const std::string name = path.empty() ? kv.first.Scalar() : path + "." + kv.first.Scalar();
      const auto [it, fresh] = seen.emplace(kv.first.Scalar(), kv.first.Mark());
      if (!fresh) {
        return name + ": the key appears twice (lines " + std::to_string(it->second.line + 1) +
               " and " + std::to_string(kv.first.Mark().line + 1) + "; the first value would win)";
      }
      std::string e = find_repeated_key(kv.second, name, depth + 1);
      if (!e.empty()) return e;
    }
  }
  return "";
}

}  // namespace

YamlDocument parse_yaml_document(const std::string& text) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    return {YAML::Node(), "malformed YAML" + at_line(e.mark) + ": " + e.msg};
  }
  for (size_t i = 1; i < docs.size(); ++i) {
    if (docs[i].IsNull()) continue;  // an empty document (a trailing "---") drops nothing
    return {YAML::Node(), "a second YAML document starts" + at_line(docs[i].Mark()) +
                              " (after '---'): the file must hold one document, or the rest "
                              "would be ignored"};
  }
  YamlDocument doc;
  if (!docs.empty()) doc.root = docs[0];
  doc.error = find_repeated_key(doc.root, "", 0);
  return doc;
}

YamlDocument load_yaml_document(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return {YAML::Node(), "is a directory, not a " + what};
  std::string text;
  const std::string why = read_whole_file(path, text);
  if (!why.empty()) return {YAML::Node(), "cannot read the " + what + ": " + why};
  return parse_yaml_document(text);
}

}  // namespace loom
