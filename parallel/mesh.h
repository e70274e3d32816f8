// parallel/mesh.h — DeviceMesh: the world's ranks laid out on four named dimensions (dp, pp, cp,
// tp) in a configurable rank order, and the MiCS partition/replication groups inside dp·cp.
// Pure arithmetic: rank ↔ coordinates ↔ group member lists. Nothing here communicates, touches
// MPI or holds state beyond the shape, so every rule is unit-tested in one process.
//
// Note [Mesh rank order]: the order string lists the dimensions from innermost (fastest
// varying) to outermost, e.g. "tp-cp-dp-pp" (the default): consecutive ranks differ in their
// tp coordinate first, so a TP group is a block of consecutive ranks (one node), and pp, the
// outermost, changes only every tp·cp·dp ranks. rank = Σ_i coord(order[i]) · Π_{j<i}
// size(order[j]).
#pragma once

#include <array>
#include <string>
#include <vector>

namespace loom::parallel {

enum class MeshDim : int { kDp = 0, kPp = 1, kCp = 2, kTp = 3 };
constexpr int kNumMeshDims = 4;
constexpr const char* kDefaultMeshOrder = "tp-cp-dp-pp";

const char* mesh_dim_name(MeshDim d);  // "dp", "pp", "cp", "tp"

// The size of each dimension (the parallel.dp/pp/cp/tp config keys).
struct MeshShape {
  int dp = 1;
  int pp = 1;
  int cp = 1;
  int tp = 1;

  int get(MeshDim d) const;
  int product() const { return dp * pp * cp * tp; }
};

// A rank's position along each dimension.
struct MeshCoords {
  int dp = 0;
  int pp = 0;
  int cp = 0;
  int tp = 0;

  int get(MeshDim d) const;
  void set(MeshDim d, int value);
  bool operator==(const MeshCoords& o) const = default;
};

class DeviceMesh {
 public:
  // Throws ConfigError naming the key when a size is < 1 ("parallel.tp: must be >= 1, got 0"),
  // when dp·pp·cp·tp != world_size, or when `order` is not a permutation of tp, cp, dp, pp
  // separated by '-' ("parallel.order").
  DeviceMesh(const MeshShape& shape, int world_size, const std::string& order = kDefaultMeshOrder);

  int world_size() const { return world_size_; }
  const MeshShape& shape() const { return shape_; }
  int size(MeshDim d) const { return shape_.get(d); }
  const std::array<MeshDim, kNumMeshDims>& order() const { return order_; }  // innermost first
  std::string order_str() const;                                             // "tp-cp-dp-pp"
  std::string str() const;  // "dp=2 pp=1 cp=2 tp=2 order=tp-cp-dp-pp (8 ranks)"

  // Rank ↔ coordinates (checked: rank in [0, world), each coordinate in [0, size)).
  MeshCoords coords(int rank) const;
  int rank_of(const MeshCoords& c) const;
  // Distance in ranks between neighbours along d (1 for the innermost dimension).
  int stride(MeshDim d) const;

  // The world ranks of the group along d that contains `rank` (same coordinates on every
  // other dimension), ordered by their coordinate along d: the group's rank i is element i.
  std::vector<int> group_members(int rank, MeshDim d) const;
  // Every group along d (world_size / size(d) groups), ordered by their lowest rank.
  std::vector<std::vector<int>> groups(MeshDim d) const;

  // The ranks that share this rank's tp and pp coordinates (every dp and cp coordinate), in
  // world-rank order: data parallelism reduces gradients over it when the sequence is split
  // over cp (each cp rank holds part of the same samples' gradient). With cp = 1 it is the dp
  // group (same members, same order).
  std::vector<int> dp_cp_group(int rank) const;
  // Note [MiCS groups]: MiCS (parallel.mics_partition_size = P, which must divide dp·cp) shards
  // within partitions of the data-parallel reduction group G = dp_cp_group(rank) (the dp group
  // when cp = 1) and replicates across them: a partition group is P consecutive members of G,
  // [k·P, (k+1)·P) (the parameters are sharded inside it); the replication group holds the
  // members with the same index inside each partition (G[i], G[i+P], G[i+2P], …). Both are
  // ordered as in G, i.e. by world rank. With cp = 1 these are P consecutive dp coordinates;
  // with cp > 1 and the default order (cp inside dp) a partition of P = k·cp ranks spans k
  // whole cp groups. P = dp·cp gives one partition (all of G) and replicas of size 1.
  void check_mics_partition_size(int partition_size) const;  // ConfigError if P ∤ dp·cp
  std::vector<int> mics_partition_group(int rank, int partition_size) const;
  std::vector<int> mics_replica_group(int rank, int partition_size) const;

 private:
  void check_rank(int rank) const;
  static std::array<MeshDim, kNumMeshDims> parse_order(const std::string& order);

  MeshShape shape_;
  int world_size_;
  std::array<MeshDim, kNumMeshDims> order_;
  std::array<int, kNumMeshDims> stride_{};  // indexed by MeshDim
};

}  // namespace loom::parallel
