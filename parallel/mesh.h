// parallel/mesh.h — DeviceMesh: the world's ranks laid out on a list of named axes (by default
// tp, cp, dp, pp) in a configurable rank order, and the groups along any set of them, including
// a two-hop split of one group (MiCS's partition and replica groups). Pure arithmetic: rank ↔
// coordinates ↔ group member lists. Nothing here communicates, touches MPI or holds state beyond
// the axes, so every rule is unit-tested in one process. A fork adds an axis (an outer local-SGD
// axis, say) by listing it: nothing here or in ParallelContext gains a member.
//
// Note [Mesh rank order]: the axes are listed from innermost (fastest varying) to outermost,
// e.g. "tp-cp-dp-pp" (the default): consecutive ranks differ in their tp coordinate first, so
// a TP group is a block of consecutive ranks (one node), and pp, the outermost, changes only
// every tp·cp·dp ranks. rank = Σ_i coord(axis i) · Π_{j<i} size(axis j).
#pragma once

#include <string>
#include <vector>

namespace loom::parallel {

// The axes of the 4D engine (the parallel.* config keys) and the two MiCS axes, which split
// the data-parallel group {dp, cp} (Note [MiCS groups]).
inline constexpr const char* kAxisDp = "dp";
inline constexpr const char* kAxisPp = "pp";
inline constexpr const char* kAxisCp = "cp";
inline constexpr const char* kAxisTp = "tp";
inline constexpr const char* kAxisMicsPartition = "mics_partition";
inline constexpr const char* kAxisMicsReplica = "mics_replica";
// Hybrid context parallelism's two axes, which split the cp group of u·r ranks into u-rank
// Ulysses groups of consecutive cp coordinates (partition_group of {cp}) and r-rank rings of
// the members with the same index in each (replica_group): Note [Hybrid context parallelism] in
// parallel/cp/hybrid.h.
inline constexpr const char* kAxisCpUlysses = "cp_ulysses";
inline constexpr const char* kAxisCpRing = "cp_ring";
constexpr const char* kDefaultMeshOrder = "tp-cp-dp-pp";

using Axes = std::vector<std::string>;

struct MeshAxis {
  std::string name;
  int size = 1;
};

// The sizes of the engine's four axes (parallel.dp, pp, cp, tp).
struct MeshShape {
  int dp = 1;
  int pp = 1;
  int cp = 1;
  int tp = 1;

  int product() const { return dp * pp * cp * tp; }
};

// The four axes of `shape` in the rank order `order` ("tp-cp-dp-pp", innermost first). Throws
// ConfigError naming the key for a size < 1 ("parallel.tp: must be >= 1, got 0") or an order
// that is not a permutation of tp, cp, dp, pp separated by '-' ("parallel.order").
std::vector<MeshAxis> mesh_axes(const MeshShape& shape, const std::string& order);

class DeviceMesh {
 public:
  // axes: innermost first, names unique and non-empty, sizes >= 1; their product must be the
  // world size (ConfigError naming the sizes otherwise).
  DeviceMesh(std::vector<MeshAxis> axes, int world_size);
  DeviceMesh(const MeshShape& shape, int world_size, const std::string& order = kDefaultMeshOrder)
      : DeviceMesh(mesh_axes(shape, order), world_size) {}

  int world_size() const { return world_size_; }
  const std::vector<MeshAxis>& axes() const { return axes_; }  // innermost first
  bool has_axis(const std::string& name) const;
  int size(const std::string& axis) const;    // throws naming an unknown axis
  int stride(const std::string& axis) const;  // distance in ranks between neighbours along it
  std::string order_str() const;              // "tp-cp-dp-pp"
  std::string str() const;                    // "tp=2 cp=1 dp=2 pp=2 (8 ranks)", innermost first

  // Rank ↔ coordinates (one per axis, in axes() order; checked).
  std::vector<int> coords(int rank) const;
  int coord(int rank, const std::string& axis) const;
  int rank_of(const std::vector<int>& coords) const;

  // The world ranks that share `rank`'s coordinates on every axis not in `axes` (they vary
  // along `axes`), in world-rank order; along one axis the group's rank i has coordinate i.
  // Empty `axes`: the rank alone.
  std::vector<int> group_members(int rank, const Axes& axes) const;
  // Every group along `axes`, ordered by their lowest rank.
  std::vector<std::vector<int>> groups(const Axes& axes) const;

  // Note [MiCS groups]: MiCS (parallel.mics_partition_size = P, which must divide the size of
  // the data-parallel reduction group G = group_members(rank, {dp, cp}), the dp group when
  // cp = 1) shards within partitions of G and replicates across them: a partition is P
  // consecutive members of G, [k·P, (k+1)·P) (the parameters are sharded inside it); the
  // replica group holds the members with the same index inside each partition (G[i], G[i+P],
  // …). Both are ordered as in G, by world rank. With cp = 1 these are P consecutive dp
  // coordinates; with cp > 1 and the default order (cp inside dp) a partition of P = k·cp ranks
  // spans k whole cp groups. P = |G| gives one partition and replicas of size 1. The same split
  // serves any hierarchical (two-hop) data parallelism over any axes.
  void check_partition_size(const Axes& axes, int partition_size) const;  // ConfigError if P ∤ |G|
  std::vector<int> partition_group(int rank, const Axes& axes, int partition_size) const;
  std::vector<int> replica_group(int rank, const Axes& axes, int partition_size) const;

 private:
  int index_of(const std::string& axis) const;
  void check_rank(int rank) const;

  std::vector<MeshAxis> axes_;
  std::vector<int> strides_;  // parallel to axes_
  int world_size_;
};

}  // namespace loom::parallel
