// parallel/topology.h — which host each rank runs on, taken from the runtime (MPI's
// shared-memory split), never from the user's arithmetic, and what that means for a layout:
// how many hosts each kind of group spans, and the start-up line that says so. HostMap is plain
// data; only host_map() communicates.
#pragma once

#include <string>
#include <vector>

#include "parallel/mesh.h"

namespace loom::parallel {

struct HostMap {
  std::vector<int> host_of;        // world rank → host index (hosts numbered by lowest rank)
  std::vector<std::string> names;  // host index → its name (MPI_Get_processor_name)
  int hosts() const { return static_cast<int>(names.size()); }
  // The number of distinct hosts among `ranks`.
  int spanned(const std::vector<int>& ranks) const;
  // "2 hosts: h0 ranks 0-1, h1 ranks 2-3" (one host: "1 host: h0 ranks 0-3").
  std::string describe() const;
};

// Collective over MPI_COMM_WORLD: every rank learns every rank's host. Without MPI: one host.
HostMap host_map();

// The groups of one kind (every tp group, every MiCS partition, …), by name, for describing
// and checking a layout.
struct GroupKind {
  std::string name;                      // "tp", "dp_cp", "mics_partition", …
  std::vector<std::vector<int>> groups;  // each group's world ranks
};
// The engine's kinds for this mesh and MiCS partition size P (0: the whole dp·cp group).
std::vector<GroupKind> group_kinds(const DeviceMesh& mesh, int mics_partition_size);

// "topology: 2 hosts: h0 ranks 0-1, h1 ranks 2-3; tp 2 inside a host, dp_cp 2 across 2 hosts".
// Kinds of size 1, and the MiCS kinds without MiCS, are left out.
std::string describe_topology(const HostMap& hosts, const std::vector<GroupKind>& kinds, bool mics);

// Note [Tensor parallelism inside a host]: every tp group on one host unless `allowed`
// (parallel.tp_across_hosts), else a ConfigError naming parallel.tp, the hosts and the ranks
// per host. The same on every rank (pure arithmetic on the same data).
void check_tp_inside_hosts(const HostMap& hosts, const DeviceMesh& mesh, bool allowed);

}  // namespace loom::parallel
