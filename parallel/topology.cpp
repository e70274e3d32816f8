// parallel/topology.cpp — the host map from MPI and the layout's groups against it (see
// parallel/topology.h).
#include "parallel/topology.h"

#if LOOM_HAS_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"

namespace loom::parallel {

int HostMap::spanned(const std::vector<int>& ranks) const {
  std::set<int> hosts;
  for (int r : ranks) hosts.insert(host_of.at(static_cast<size_t>(r)));
  return static_cast<int>(hosts.size());
}

namespace {
// "0-1", "0,2,4": a host's ranks, consecutive runs joined.
std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}
}  // namespace

std::string HostMap::describe() const {
  std::string out = std::to_string(hosts()) + (hosts() == 1 ? " host:" : " hosts:");
  for (int h = 0; h < hosts(); ++h) {
    std::vector<int> ranks;
    for (size_t r = 0; r < host_of.size(); ++r) {
      if (host_of[r] == h) ranks.push_back(static_cast<int>(r));
    }
    out += h == 0 ? " " : ", ";
    out += names[static_cast<size_t>(h)];
    out += ranks.size() == 1 ? " rank " : " ranks ";
    out += rank_ranges(ranks);
  }
  return out;
}

HostMap host_map() {
  HostMap map;
#if LOOM_HAS_MPI
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // A host is what MPI's shared-memory split calls one; its key is its lowest world rank.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int leader = rank;
  MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  std::vector<int> leaders(static_cast<size_t>(size));
  MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> names(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, MPI_COMM_WORLD);
  std::map<int, int> index;  // leader → host index, in rank order
  for (int r = 0; r < size; ++r) {
    const int l = leaders[static_cast<size_t>(r)];
    if (!index.count(l)) {
      index[l] = static_cast<int>(map.names.size());
      const char* n = &names[static_cast<size_t>(l) * MPI_MAX_PROCESSOR_NAME];
      map.names.emplace_back(n, strnlen(n, MPI_MAX_PROCESSOR_NAME));
    }
    map.host_of.push_back(index[l]);
  }
#else
  map.host_of = {0};
  map.names = {"localhost"};
#endif
  return map;
}

std::vector<GroupKind> group_kinds(const DeviceMesh& mesh, int mics_partition_size) {
  std::vector<GroupKind> kinds;
  for (const MeshAxis& a : mesh.axes()) kinds.push_back({a.name, mesh.groups({a.name})});
  const Axes dp_cp = {kAxisDp, kAxisCp};
  kinds.push_back({"dp_cp", mesh.groups(dp_cp)});
  const int P =
      mics_partition_size > 0 ? mics_partition_size : mesh.size(kAxisDp) * mesh.size(kAxisCp);
  GroupKind partitions{kAxisMicsPartition, {}}, replicas{kAxisMicsReplica, {}};
  std::set<std::vector<int>> seen_p, seen_r;
  for (int r = 0; r < mesh.world_size(); ++r) {
    std::vector<int> p = mesh.partition_group(r, dp_cp, P), q = mesh.replica_group(r, dp_cp, P);
    if (seen_p.insert(p).second) partitions.groups.push_back(p);
    if (seen_r.insert(q).second) replicas.groups.push_back(q);
  }
  kinds.push_back(partitions);
  kinds.push_back(replicas);
  return kinds;
}

std::string describe_topology(const HostMap& hosts, const std::vector<GroupKind>& kinds,
                              bool mics) {
  std::string out = "topology: " + hosts.describe();
  std::string groups;
  for (const GroupKind& k : kinds) {
    if (k.groups.empty() || k.groups.front().size() < 2) continue;
    if (!mics && (k.name == kAxisMicsPartition || k.name == kAxisMicsReplica)) continue;
    int most = 0;
    for (const std::vector<int>& g : k.groups) most = std::max(most, hosts.spanned(g));
    if (!groups.empty()) groups += ", ";
    groups += k.name + " " + std::to_string(k.groups.front().size());
    groups +=
        most == 1 ? std::string(" inside a host") : " across " + std::to_string(most) + " hosts";
  }
  return out + (groups.empty() ? "" : "; " + groups);
}

void check_tp_inside_hosts(const HostMap& hosts, const DeviceMesh& mesh, bool allowed) {
  if (allowed || mesh.size(kAxisTp) < 2) return;
  for (const std::vector<int>& g : mesh.groups({kAxisTp})) {
    const int n = hosts.spanned(g);
    if (n < 2) continue;
    int per_host = 0;
    for (int h : hosts.host_of) per_host += h == hosts.host_of[static_cast<size_t>(g.front())];
    throw ConfigError(
        "parallel.tp: the tensor-parallel group of ranks " + std::to_string(g.front()) + "-" +
        std::to_string(g.back()) + " spans " + std::to_string(n) + " hosts (" +
        std::to_string(per_host) + " ranks on host " +
        hosts.names[static_cast<size_t>(hosts.host_of[static_cast<size_t>(g.front())])] +
        "): its all-reduces run every layer and belong inside a host; make "
        "parallel.tp divide the ranks per host, or set parallel.tp_across_hosts: "
        "true to run it anyway");
  }
}

}  // namespace loom::parallel
