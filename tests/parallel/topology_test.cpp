// tests/parallel/topology_test.cpp — the host map's arithmetic (parallel/topology.h): hosts
// spanned by a group, the start-up line, and the refusal of tensor-parallel groups across hosts
// (the MPI side, host_map(), runs in multihost.parallel.context_2x4).
#include "parallel/topology.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace loom::parallel {
namespace {

HostMap two_hosts_of_four() {  // ranks 0-3 on h0, 4-7 on h1
  return {{0, 0, 0, 0, 1, 1, 1, 1}, {"h0", "h1"}};
}

TEST(Topology, HostsSpannedAndDescribed) {
  const HostMap m = two_hosts_of_four();
  EXPECT_EQ(m.spanned({0, 1, 2}), 1);
  EXPECT_EQ(m.spanned({3, 4}), 2);
  EXPECT_EQ(m.describe(), "2 hosts: h0 ranks 0-3, h1 ranks 4-7");
  const HostMap odd{{0, 1, 0, 1}, {"a", "b"}};
  EXPECT_EQ(odd.describe(), "2 hosts: a ranks 0,2, b ranks 1,3");
  EXPECT_EQ((HostMap{{0}, {"x"}}).describe(), "1 host: x rank 0");
}

TEST(Topology, TheLineSaysWhereEachKindOfGroupLies) {
  const HostMap m = two_hosts_of_four();
  // tp 2 innermost, dp 2, pp 2: tp pairs inside a host, dp pairs inside, pp across.
  const DeviceMesh mesh(MeshShape{.dp = 2, .pp = 2, .tp = 2}, 8);
  EXPECT_EQ(describe_topology(m, group_kinds(mesh, 0), false),
            "topology: 2 hosts: h0 ranks 0-3, h1 ranks 4-7; tp 2 inside a host, dp 2 inside a "
            "host, pp 2 across 2 hosts, dp_cp 2 inside a host");
  // dp 8 with MiCS partitions of 4: the partition inside a host, the replicas across.
  const DeviceMesh dp8(MeshShape{.dp = 8}, 8);
  EXPECT_EQ(describe_topology(m, group_kinds(dp8, 4), true),
            "topology: 2 hosts: h0 ranks 0-3, h1 ranks 4-7; dp 8 across 2 hosts, dp_cp 8 across "
            "2 hosts, mics_partition 4 inside a host, mics_replica 2 across 2 hosts");
}

TEST(Topology, TensorParallelAcrossHostsIsRefusedUnlessAllowed) {
  const HostMap m = two_hosts_of_four();
  EXPECT_NO_THROW(check_tp_inside_hosts(m, DeviceMesh(MeshShape{.dp = 2, .tp = 4}, 8), false));
  const DeviceMesh tp8(MeshShape{.tp = 8}, 8);
  try {
    check_tp_inside_hosts(m, tp8, false);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "parallel.tp: the tensor-parallel group of ranks 0-7 spans 2 hosts (4 ranks on host "
              "h0): its all-reduces run every layer and belong inside a host; make parallel.tp "
              "divide the ranks per host, or set parallel.tp_across_hosts: true to run it anyway");
  }
  EXPECT_NO_THROW(check_tp_inside_hosts(m, tp8, true));
}

}  // namespace
}  // namespace loom::parallel
