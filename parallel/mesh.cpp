// parallel/mesh.cpp — DeviceMesh arithmetic (see Note [Mesh rank order] in parallel/mesh.h).
// No communication and no state beyond the mesh's shape.
#include "parallel/mesh.h"

#include <algorithm>
#include <cstddef>
#include <sstream>

#include "core/error.h"

namespace loom::parallel {

namespace {

constexpr std::array<MeshDim, kNumMeshDims> kAllDims = {MeshDim::kDp, MeshDim::kPp, MeshDim::kCp,
                                                        MeshDim::kTp};

int dim_index(MeshDim d) { return static_cast<int>(d); }

// The position of `rank` in `group` (which holds it).
size_t index_in(const std::vector<int>& group, int rank) {
  return static_cast<size_t>(std::find(group.begin(), group.end(), rank) - group.begin());
}

}  // namespace

const char* mesh_dim_name(MeshDim d) {
  switch (d) {
    case MeshDim::kDp:
      return "dp";
    case MeshDim::kPp:
      return "pp";
    case MeshDim::kCp:
      return "cp";
    case MeshDim::kTp:
      return "tp";
  }
  return "?";
}

int MeshShape::get(MeshDim d) const {
  switch (d) {
    case MeshDim::kDp:
      return dp;
    case MeshDim::kPp:
      return pp;
    case MeshDim::kCp:
      return cp;
    case MeshDim::kTp:
      return tp;
  }
  LOOM_FAIL("MeshShape::get: unknown dimension");
}

int MeshCoords::get(MeshDim d) const {
  switch (d) {
    case MeshDim::kDp:
      return dp;
    case MeshDim::kPp:
      return pp;
    case MeshDim::kCp:
      return cp;
    case MeshDim::kTp:
      return tp;
  }
  LOOM_FAIL("MeshCoords::get: unknown dimension");
}

void MeshCoords::set(MeshDim d, int value) {
  switch (d) {
    case MeshDim::kDp:
      dp = value;
      return;
    case MeshDim::kPp:
      pp = value;
      return;
    case MeshDim::kCp:
      cp = value;
      return;
    case MeshDim::kTp:
      tp = value;
      return;
  }
  LOOM_FAIL("MeshCoords::set: unknown dimension");
}

std::array<MeshDim, kNumMeshDims> DeviceMesh::parse_order(const std::string& order) {
  std::array<MeshDim, kNumMeshDims> out{};
  std::array<bool, kNumMeshDims> seen{};
  int n = 0;
  std::stringstream ss(order);
  std::string name;
  while (std::getline(ss, name, '-')) {
    int found = -1;
    for (MeshDim d : kAllDims) {
      if (name == mesh_dim_name(d)) found = dim_index(d);
    }
    LOOM_CONFIG_CHECK(
        found >= 0, "parallel.order: unknown dimension '", name, "' in '", order,
        "' (expected the four names tp, cp, dp, pp separated by '-', innermost first)");
    LOOM_CONFIG_CHECK(!seen[found], "parallel.order: dimension '", name, "' appears twice in '",
                      order, "'");
    seen[found] = true;
    out[n++] = static_cast<MeshDim>(found);
  }
  LOOM_CONFIG_CHECK(n == kNumMeshDims, "parallel.order: '", order,
                    "' must name all four dimensions tp, cp, dp, pp (innermost first)");
  return out;
}

DeviceMesh::DeviceMesh(const MeshShape& shape, int world_size, const std::string& order)
    : shape_(shape), world_size_(world_size), order_(parse_order(order)) {
  for (MeshDim d : kAllDims) {
    LOOM_CONFIG_CHECK(shape.get(d) >= 1, "parallel.", mesh_dim_name(d), ": must be >= 1, got ",
                      shape.get(d));
  }
  LOOM_CONFIG_CHECK(world_size >= 1, "parallel: world size must be >= 1, got ", world_size);
  LOOM_CONFIG_CHECK(shape.product() == world_size, "parallel: parallel.dp ", shape.dp,
                    " x parallel.pp ", shape.pp, " x parallel.cp ", shape.cp, " x parallel.tp ",
                    shape.tp, " = ", shape.product(), " does not equal the world size ", world_size,
                    " (ranks launched)");
  int stride = 1;
  for (MeshDim d : order_) {
    stride_[dim_index(d)] = stride;
    stride *= shape.get(d);
  }
}

std::string DeviceMesh::order_str() const {
  std::string s;
  for (MeshDim d : order_) {
    if (!s.empty()) s += "-";
    s += mesh_dim_name(d);
  }
  return s;
}

std::string DeviceMesh::str() const {
  return detail::str("dp=", shape_.dp, " pp=", shape_.pp, " cp=", shape_.cp, " tp=", shape_.tp,
                     " order=", order_str(), " (", world_size_, " ranks)");
}

void DeviceMesh::check_rank(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_size_, "DeviceMesh: rank ", rank, " out of range for ",
             str());
}

int DeviceMesh::stride(MeshDim d) const { return stride_[dim_index(d)]; }

MeshCoords DeviceMesh::coords(int rank) const {
  check_rank(rank);
  MeshCoords c;
  for (MeshDim d : kAllDims) c.set(d, (rank / stride(d)) % size(d));
  return c;
}

int DeviceMesh::rank_of(const MeshCoords& c) const {
  int rank = 0;
  for (MeshDim d : kAllDims) {
    const int x = c.get(d);
    LOOM_CHECK(x >= 0 && x < size(d), "DeviceMesh: ", mesh_dim_name(d), " coordinate ", x,
               " out of range [0, ", size(d), ") for ", str());
    rank += x * stride(d);
  }
  return rank;
}

std::vector<int> DeviceMesh::group_members(int rank, MeshDim d) const {
  MeshCoords c = coords(rank);
  std::vector<int> members;
  members.reserve(static_cast<size_t>(size(d)));
  for (int i = 0; i < size(d); ++i) {
    c.set(d, i);
    members.push_back(rank_of(c));
  }
  return members;
}

std::vector<std::vector<int>> DeviceMesh::groups(MeshDim d) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_size_; ++r) {
    if (coords(r).get(d) == 0) out.push_back(group_members(r, d));  // ascending first ranks
  }
  return out;
}

std::vector<int> DeviceMesh::dp_cp_group(int rank) const {
  const MeshCoords me = coords(rank);
  std::vector<int> out;
  for (int r = 0; r < world_size_; ++r) {
    const MeshCoords c = coords(r);
    if (c.tp == me.tp && c.pp == me.pp) out.push_back(r);
  }
  return out;
}

void DeviceMesh::check_mics_partition_size(int partition_size) const {
  LOOM_CONFIG_CHECK(partition_size >= 1, "parallel.mics_partition_size: must be >= 1, got ",
                    partition_size);
  const int n = shape_.dp * shape_.cp;
  if (shape_.cp == 1) {
    LOOM_CONFIG_CHECK(n % partition_size == 0, "parallel.mics_partition_size: ", partition_size,
                      " does not divide parallel.dp ", shape_.dp);
  } else {
    LOOM_CONFIG_CHECK(n % partition_size == 0, "parallel.mics_partition_size: ", partition_size,
                      " does not divide parallel.dp ", shape_.dp, " × parallel.cp ", shape_.cp,
                      " = ", n);
  }
}

std::vector<int> DeviceMesh::mics_partition_group(int rank, int partition_size) const {
  check_mics_partition_size(partition_size);
  const std::vector<int> group = dp_cp_group(rank);
  const size_t index = index_in(group, rank);
  const size_t first =
      index / static_cast<size_t>(partition_size) * static_cast<size_t>(partition_size);
  return {group.begin() + static_cast<std::ptrdiff_t>(first),
          group.begin() + static_cast<std::ptrdiff_t>(first) + partition_size};
}

std::vector<int> DeviceMesh::mics_replica_group(int rank, int partition_size) const {
  check_mics_partition_size(partition_size);
  const std::vector<int> group = dp_cp_group(rank);
  const size_t p = static_cast<size_t>(partition_size);
  std::vector<int> members;
  for (size_t i = index_in(group, rank) % p; i < group.size(); i += p) members.push_back(group[i]);
  return members;
}

}  // namespace loom::parallel
