// optim/decay_rule.cpp — the weight-decay rules (see Note [Default decay rule]).
#include "optim/decay_rule.h"

#include <algorithm>
#include <cctype>

namespace loom::optim {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool excluded_by_name(const std::string& name) {
  const std::string n = lower(name);
  if (n == "bias" || ends_with(n, ".bias")) return true;
  if (contains(n, "ln_") || contains(n, "norm")) return true;
  return contains(n, "wte") || contains(n, "wpe") || contains(n, "embed");
}

}  // namespace

DecayRule parse_decay_rule(const std::string& s) {
  if (s == "default") return DecayRule::kDefault;
  if (s == "all") return DecayRule::kAll;
  if (s == "matrices") return DecayRule::kMatricesOnly;
  LOOM_FAIL("optim.decay_rule: unknown rule '", s, "' (default, all, matrices)");
}

const char* decay_rule_name(DecayRule rule) {
  switch (rule) {
    case DecayRule::kDefault:
      return "default";
    case DecayRule::kAll:
      return "all";
    case DecayRule::kMatricesOnly:
      return "matrices";
  }
  return "?";
}

bool decays(DecayRule rule, const std::string& name, const Shape& shape) {
  switch (rule) {
    case DecayRule::kAll:
      return true;
    case DecayRule::kMatricesOnly:
      return shape.size() >= 2;
    case DecayRule::kDefault:
      return shape.size() >= 2 && !excluded_by_name(name);
  }
  return false;
}

std::vector<ParamRef> make_param_refs(const std::vector<std::pair<std::string, Tensor>>& named,
                                      DecayRule rule) {
  std::vector<ParamRef> refs;
  refs.reserve(named.size());
  for (const auto& [name, t] : named) refs.push_back({name, t, decays(rule, name, t.shape())});
  return refs;
}

}  // namespace loom::optim
