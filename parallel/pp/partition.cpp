// parallel/pp/partition.cpp — layer partitioning and parameter ownership (see
// parallel/pp/partition.h).
#include "parallel/pp/partition.h"

#include <sstream>

#include "core/error.h"

namespace loom::parallel::pp {

std::vector<int64_t> partition_layers(int64_t n_layer, int num_stages, const std::string& layout) {
  LOOM_CONFIG_CHECK(num_stages >= 1, "parallel.pp: pp·vpp must be >= 1, got ", num_stages);
  std::vector<int64_t> b = {0};
  if (layout.empty()) {
    LOOM_CONFIG_CHECK(n_layer % num_stages == 0, "parallel.pp: pp·vpp = ", num_stages,
                      " does not divide model.n_layer ", n_layer, " (or give parallel.pp_layout)");
    for (int s = 0; s < num_stages; ++s) b.push_back(b.back() + n_layer / num_stages);
    return b;
  }
  std::stringstream in(layout);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t n = 0;
    try {
      n = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LOOM_CONFIG_CHECK(used > 0 && item.find_first_not_of(" ", used) == std::string::npos,
                      "parallel.pp_layout: '", item,
                      "' is not a number (expected e.g. \"3,3,2,2\")");
    LOOM_CONFIG_CHECK(n >= 1, "parallel.pp_layout: every stage needs at least one layer, got ", n);
    b.push_back(b.back() + n);
  }
  LOOM_CONFIG_CHECK(static_cast<int>(b.size()) - 1 == num_stages,
                    "parallel.pp_layout: ", b.size() - 1,
                    " entries, expected pp·vpp = ", num_stages);
  LOOM_CONFIG_CHECK(b.back() == n_layer, "parallel.pp_layout: the entries sum to ", b.back(),
                    ", expected model.n_layer ", n_layer);
  return b;
}

std::vector<int> stages_of_parameter(const std::string& name, const Tensor& p,
                                     const std::vector<int64_t>& b, bool tied_table) {
  const int last = static_cast<int>(b.size()) - 2;
  const ParamRole* role = p.role();
  LOOM_CHECK(role != nullptr, "pipeline: parameter '", name,
             "' has no role in a model (a Transformer records them, core/param_role.h)");
  if (role->part == ParamRole::Part::kInput) {
    if (tied_table && last > 0) return {0, last};
    return {0};
  }
  if (role->part == ParamRole::Part::kBlock) {
    for (int s = 0; s <= last; ++s) {
      if (role->block >= b[static_cast<size_t>(s)] && role->block < b[static_cast<size_t>(s) + 1])
        return {s};
    }
    LOOM_FAIL("pipeline: block ", role->block, " of parameter '", name,
              "' is outside the partition");
  }
  return {last};  // the final norm, an untied head
}

}  // namespace loom::parallel::pp
