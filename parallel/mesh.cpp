// parallel/mesh.cpp — DeviceMesh arithmetic (see Note [Mesh rank order] in parallel/mesh.h).
// No communication and no state beyond the mesh's axes.
#include "parallel/mesh.h"

#include <algorithm>
#include <cstddef>
#include <sstream>

#include "core/error.h"

namespace loom::parallel {

namespace {

// The position of `rank` in `group` (which holds it).
size_t index_in(const std::vector<int>& group, int rank) {
  return static_cast<size_t>(std::find(group.begin(), group.end(), rank) - group.begin());
}

}  // namespace

std::vector<MeshAxis> mesh_axes(const MeshShape& shape, const std::string& order) {
  const std::vector<MeshAxis> known = {
      {kAxisTp, shape.tp}, {kAxisCp, shape.cp}, {kAxisDp, shape.dp}, {kAxisPp, shape.pp}};
  for (const MeshAxis& a : known) {
    LOOM_CONFIG_CHECK(a.size >= 1, "parallel.", a.name, ": must be >= 1, got ", a.size);
  }
  std::vector<MeshAxis> out;
  std::stringstream ss(order);
  std::string name;
  while (std::getline(ss, name, '-')) {
    auto it =
        std::find_if(known.begin(), known.end(), [&](const MeshAxis& a) { return a.name == name; });
    LOOM_CONFIG_CHECK(
        it != known.end(), "parallel.order: unknown dimension '", name, "' in '", order,
        "' (expected the four names tp, cp, dp, pp separated by '-', innermost first)");
    for (const MeshAxis& a : out) {
      LOOM_CONFIG_CHECK(a.name != name, "parallel.order: dimension '", name, "' appears twice in '",
                        order, "'");
    }
    out.push_back(*it);
  }
  LOOM_CONFIG_CHECK(out.size() == known.size(), "parallel.order: '", order,
                    "' must name all four dimensions tp, cp, dp, pp (innermost first)");
  return out;
}

DeviceMesh::DeviceMesh(std::vector<MeshAxis> axes, int world_size)
    : axes_(std::move(axes)), world_size_(world_size) {
  LOOM_CONFIG_CHECK(world_size >= 1, "parallel: world size must be >= 1, got ", world_size);
  int product = 1;
  std::string sizes;
  for (size_t i = 0; i < axes_.size(); ++i) {
    const MeshAxis& a = axes_[i];
    LOOM_CHECK(!a.name.empty(), "DeviceMesh: axis ", i, " has no name");
    LOOM_CONFIG_CHECK(a.size >= 1, "parallel.", a.name, ": must be >= 1, got ", a.size);
    for (size_t j = 0; j < i; ++j) {
      LOOM_CHECK(axes_[j].name != a.name, "DeviceMesh: axis '", a.name, "' listed twice");
    }
    strides_.push_back(product);
    product *= a.size;
    sizes += (sizes.empty() ? "parallel." : " x parallel.") + a.name + " " + std::to_string(a.size);
  }
  LOOM_CONFIG_CHECK(product == world_size, "parallel: ", sizes, " = ", product,
                    " does not equal the world size ", world_size, " (ranks launched)");
}

int DeviceMesh::index_of(const std::string& axis) const {
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i].name == axis) return static_cast<int>(i);
  }
  LOOM_FAIL("DeviceMesh: no axis '", axis, "' in ", str());
}

bool DeviceMesh::has_axis(const std::string& name) const {
  return std::any_of(axes_.begin(), axes_.end(), [&](const MeshAxis& a) { return a.name == name; });
}

int DeviceMesh::size(const std::string& axis) const {
  return axes_[static_cast<size_t>(index_of(axis))].size;
}

int DeviceMesh::stride(const std::string& axis) const {
  return strides_[static_cast<size_t>(index_of(axis))];
}

std::string DeviceMesh::order_str() const {
  std::string s;
  for (const MeshAxis& a : axes_) s += (s.empty() ? "" : "-") + a.name;
  return s;
}

std::string DeviceMesh::str() const {
  std::string s;
  for (const MeshAxis& a : axes_) s += a.name + "=" + std::to_string(a.size) + " ";
  return s + "order=" + order_str() + " (" + std::to_string(world_size_) + " ranks)";
}

void DeviceMesh::check_rank(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_size_, "DeviceMesh: rank ", rank, " out of range for ",
             str());
}

std::vector<int> DeviceMesh::coords(int rank) const {
  check_rank(rank);
  std::vector<int> c;
  for (size_t i = 0; i < axes_.size(); ++i) c.push_back((rank / strides_[i]) % axes_[i].size);
  return c;
}

int DeviceMesh::coord(int rank, const std::string& axis) const {
  check_rank(rank);
  const size_t i = static_cast<size_t>(index_of(axis));
  return (rank / strides_[i]) % axes_[i].size;
}

int DeviceMesh::rank_of(const std::vector<int>& c) const {
  LOOM_CHECK(c.size() == axes_.size(), "DeviceMesh: ", c.size(), " coordinates for ", axes_.size(),
             " axes");
  int rank = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    LOOM_CHECK(c[i] >= 0 && c[i] < axes_[i].size, "DeviceMesh: ", axes_[i].name, " coordinate ",
               c[i], " out of range [0, ", axes_[i].size, ") for ", str());
    rank += c[i] * strides_[i];
  }
  return rank;
}

std::vector<int> DeviceMesh::group_members(int rank, const Axes& axes) const {
  std::vector<bool> varies(axes_.size(), false);
  for (const std::string& a : axes) varies[static_cast<size_t>(index_of(a))] = true;
  const std::vector<int> me = coords(rank);
  std::vector<int> out;
  for (int r = 0; r < world_size_; ++r) {
    const std::vector<int> c = coords(r);
    bool same = true;
    for (size_t i = 0; i < c.size(); ++i) same = same && (varies[i] || c[i] == me[i]);
    if (same) out.push_back(r);
  }
  return out;
}

std::vector<std::vector<int>> DeviceMesh::groups(const Axes& axes) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_size_; ++r) {
    std::vector<int> g = group_members(r, axes);
    if (g.front() == r) out.push_back(std::move(g));  // ascending first ranks
  }
  return out;
}

void DeviceMesh::check_partition_size(const Axes& axes, int partition_size) const {
  LOOM_CONFIG_CHECK(partition_size >= 1, "parallel.mics_partition_size: must be >= 1, got ",
                    partition_size);
  int n = 1, named = 0;
  std::string sizes;
  for (const std::string& a : axes) {
    n *= size(a);
    if (size(a) == 1 && a != axes.front()) continue;  // "parallel.dp 4" when cp is 1
    sizes += (sizes.empty() ? "parallel." : " × parallel.") + a + " " + std::to_string(size(a));
    ++named;
  }
  LOOM_CONFIG_CHECK(n % partition_size == 0, "parallel.mics_partition_size: ", partition_size,
                    " does not divide ", sizes, named > 1 ? " = " + std::to_string(n) : "");
}

std::vector<int> DeviceMesh::partition_group(int rank, const Axes& axes, int partition_size) const {
  check_partition_size(axes, partition_size);
  const std::vector<int> group = group_members(rank, axes);
  const size_t p = static_cast<size_t>(partition_size);
  const size_t first = index_in(group, rank) / p * p;
  return {group.begin() + static_cast<std::ptrdiff_t>(first),
          group.begin() + static_cast<std::ptrdiff_t>(first + p)};
}

std::vector<int> DeviceMesh::replica_group(int rank, const Axes& axes, int partition_size) const {
  check_partition_size(axes, partition_size);
  const std::vector<int> group = group_members(rank, axes);
  const size_t p = static_cast<size_t>(partition_size);
  std::vector<int> members;
  for (size_t i = index_in(group, rank) % p; i < group.size(); i += p) members.push_back(group[i]);
  return members;
}

}  // namespace loom::parallel
