// core/placement.cpp — Placement's small queries and its printed form (see core/placement.h).
#include "core/placement.h"

#include <algorithm>
#include <sstream>

namespace loom {

const PlacementSplit* Placement::split_over(const std::string& axis) const {
  for (const PlacementSplit& s : splits) {
    if (s.axis == axis) return &s;
  }
  return nullptr;
}

bool Placement::is_replicated_over(const std::string& axis) const {
  return std::find(replicated.begin(), replicated.end(), axis) != replicated.end();
}

void Placement::add_replicated(const std::string& axis) {
  if (split_over(axis) == nullptr && !is_replicated_over(axis)) replicated.push_back(axis);
}

void Placement::remove_replicated(const std::string& axis) {
  replicated.erase(std::remove(replicated.begin(), replicated.end(), axis), replicated.end());
}

std::string placement_str(const Placement& p) {
  std::ostringstream os;
  os << "global (";
  for (size_t i = 0; i < p.global_shape.size(); ++i) os << (i ? ", " : "") << p.global_shape[i];
  os << ")";
  for (const PlacementSplit& s : p.splits) {
    os << "; dim " << s.dim << " over " << s.axis << ":";
    for (size_t i = 0; i < s.runs.size(); ++i) {
      os << (i ? ", " : " ") << s.runs[i].local << "→" << s.runs[i].global << " ("
         << s.runs[i].length << (s.runs[i].counted ? "" : ", not counted here") << ")";
    }
  }
  if (!p.replicated.empty()) {
    os << "; replicated over ";
    for (size_t i = 0; i < p.replicated.size(); ++i) os << (i ? ", " : "") << p.replicated[i];
  }
  if (!p.tied_to.empty()) os << "; tied to " << p.tied_to;
  if (!p.counted) os << "; not counted here";
  return os.str();
}

}  // namespace loom
