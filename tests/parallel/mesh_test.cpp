// tests/parallel/mesh_test.cpp — DeviceMesh arithmetic in one process, no MPI: coordinates
// round-trip for every rank of many shapes and every rank order, each dimension's groups
// partition the world, the default order keeps tp groups contiguous, MiCS partition and
// replica groups, and the configuration errors name their keys.
#include "parallel/mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>

#include "core/error.h"

namespace loom::parallel {
namespace {

const MeshDim kDims[] = {MeshDim::kDp, MeshDim::kPp, MeshDim::kCp, MeshDim::kTp};

// Every (dp, pp, cp, tp) with product <= max_world.
std::vector<MeshShape> shapes(int max_world) {
  std::vector<MeshShape> out;
  for (int dp = 1; dp <= max_world; ++dp)
    for (int pp = 1; dp * pp <= max_world; ++pp)
      for (int cp = 1; dp * pp * cp <= max_world; ++cp)
        for (int tp = 1; dp * pp * cp * tp <= max_world; ++tp) out.push_back({dp, pp, cp, tp});
  return out;
}

// All 24 orders.
std::vector<std::string> orders() {
  std::vector<std::string> names = {"cp", "dp", "pp", "tp"};  // sorted for next_permutation
  std::vector<std::string> out;
  do {
    out.push_back(names[0] + "-" + names[1] + "-" + names[2] + "-" + names[3]);
  } while (std::next_permutation(names.begin(), names.end()));
  return out;
}

std::string config_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Mesh, CoordinatesRoundTripForEveryShapeAndOrder) {
  for (const MeshShape& s : shapes(12)) {
    for (const std::string& order : orders()) {
      DeviceMesh mesh(s, s.product(), order);
      std::set<std::vector<int>> seen;
      for (int r = 0; r < mesh.world_size(); ++r) {
        const MeshCoords c = mesh.coords(r);
        for (MeshDim d : kDims) {
          ASSERT_GE(c.get(d), 0);
          ASSERT_LT(c.get(d), s.get(d));
        }
        ASSERT_EQ(mesh.rank_of(c), r) << mesh.str();
        seen.insert({c.dp, c.pp, c.cp, c.tp});
      }
      EXPECT_EQ(static_cast<int>(seen.size()), mesh.world_size()) << mesh.str();
      EXPECT_EQ(mesh.order_str(), order);
    }
  }
}

TEST(Mesh, GroupsPartitionTheWorldAlongEveryDimension) {
  for (const MeshShape& s : shapes(16)) {
    for (const std::string& order : {std::string(kDefaultMeshOrder), std::string("pp-dp-tp-cp")}) {
      DeviceMesh mesh(s, s.product(), order);
      for (MeshDim d : kDims) {
        std::vector<int> owner(static_cast<size_t>(mesh.world_size()), -1);
        const auto groups = mesh.groups(d);
        ASSERT_EQ(static_cast<int>(groups.size()), mesh.world_size() / s.get(d));
        for (size_t g = 0; g < groups.size(); ++g) {
          ASSERT_EQ(static_cast<int>(groups[g].size()), s.get(d));
          for (size_t i = 0; i < groups[g].size(); ++i) {
            const int r = groups[g][i];
            ASSERT_EQ(owner[static_cast<size_t>(r)], -1) << "rank " << r << " in two groups";
            owner[static_cast<size_t>(r)] = static_cast<int>(g);
            MeshCoords c = mesh.coords(r), c0 = mesh.coords(groups[g][0]);
            EXPECT_EQ(c.get(d), static_cast<int>(i));  // group rank = coordinate along d
            c.set(d, 0);
            EXPECT_EQ(c, c0);  // every other coordinate shared
            EXPECT_EQ(mesh.group_members(r, d), groups[g]);
          }
        }
        EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
      }
    }
  }
}

TEST(Mesh, DefaultOrderKeepsTensorParallelGroupsContiguous) {
  for (const MeshShape& s : shapes(16)) {
    DeviceMesh mesh(s, s.product());
    EXPECT_EQ(mesh.stride(MeshDim::kTp), 1);
    EXPECT_EQ(mesh.stride(MeshDim::kCp), s.tp);
    EXPECT_EQ(mesh.stride(MeshDim::kDp), s.tp * s.cp);
    EXPECT_EQ(mesh.stride(MeshDim::kPp), s.tp * s.cp * s.dp);
    for (int r = 0; r < mesh.world_size(); ++r) {
      const auto tp = mesh.group_members(r, MeshDim::kTp);
      for (int i = 0; i < s.tp; ++i) EXPECT_EQ(tp[static_cast<size_t>(i)], (r / s.tp) * s.tp + i);
    }
  }
}

TEST(Mesh, WorkedExample) {
  // dp=2 pp=2 cp=1 tp=2, default order: rank = tp + 2·dp + 4·pp.
  DeviceMesh mesh({.dp = 2, .pp = 2, .cp = 1, .tp = 2}, 8);
  EXPECT_EQ(mesh.coords(5), (MeshCoords{.dp = 0, .pp = 1, .cp = 0, .tp = 1}));
  EXPECT_EQ(mesh.coords(6), (MeshCoords{.dp = 1, .pp = 1, .cp = 0, .tp = 0}));
  EXPECT_EQ(mesh.group_members(5, MeshDim::kTp), (std::vector<int>{4, 5}));
  EXPECT_EQ(mesh.group_members(5, MeshDim::kDp), (std::vector<int>{5, 7}));
  EXPECT_EQ(mesh.group_members(5, MeshDim::kPp), (std::vector<int>{1, 5}));
  EXPECT_EQ(mesh.group_members(5, MeshDim::kCp), (std::vector<int>{5}));
  EXPECT_EQ(mesh.str(), "dp=2 pp=2 cp=1 tp=2 order=tp-cp-dp-pp (8 ranks)");
  // dp innermost instead: rank = dp + 2·tp + 4·pp.
  DeviceMesh dp_first({.dp = 2, .pp = 2, .cp = 1, .tp = 2}, 8, "dp-tp-cp-pp");
  EXPECT_EQ(dp_first.group_members(5, MeshDim::kDp), (std::vector<int>{4, 5}));
  EXPECT_EQ(dp_first.group_members(5, MeshDim::kTp), (std::vector<int>{5, 7}));
}

// MiCS groups (Note [MiCS groups]): partitions of P consecutive members of the dp·cp group and
// replicas of the same index in each partition, for every shape up to 16 ranks, every P that
// divides dp·cp and a few orders; with cp = 1 the partition is P consecutive dp coordinates.
TEST(Mesh, MicsPartitionAndReplicaGroups) {
  for (const MeshShape& s : shapes(16)) {
    for (const char* order : {kDefaultMeshOrder, "dp-cp-tp-pp", "pp-tp-dp-cp"}) {
      DeviceMesh mesh(s, s.product(), order);
      const int n = s.dp * s.cp;
      for (int p = 1; p <= n; ++p) {
        if (n % p != 0) continue;
        for (int r = 0; r < mesh.world_size(); ++r) {
          const auto part = mesh.mics_partition_group(r, p);
          const auto repl = mesh.mics_replica_group(r, p);
          const auto group = mesh.dp_cp_group(r);
          ASSERT_EQ(static_cast<int>(group.size()), n);
          ASSERT_EQ(static_cast<int>(part.size()), p);
          ASSERT_EQ(static_cast<int>(repl.size()), n / p);
          const int x = static_cast<int>(std::find(group.begin(), group.end(), r) - group.begin());
          for (int i = 0; i < p; ++i) {  // P consecutive members of the dp·cp group
            EXPECT_EQ(part[static_cast<size_t>(i)], group[static_cast<size_t>((x / p) * p + i)]);
          }
          for (int k = 0; k < n / p; ++k) {  // same index in each partition
            EXPECT_EQ(repl[static_cast<size_t>(k)], group[static_cast<size_t>(k * p + x % p)]);
          }
          EXPECT_EQ(part[static_cast<size_t>(x % p)], r);
          EXPECT_EQ(repl[static_cast<size_t>(x / p)], r);
          for (int q : part) {  // the partition shares tp and pp, and so the model replica's part
            EXPECT_EQ(mesh.coords(q).tp, mesh.coords(r).tp);
            EXPECT_EQ(mesh.coords(q).pp, mesh.coords(r).pp);
          }
          if (s.cp == 1) {  // the dp group, P consecutive dp coordinates
            const auto dp = mesh.group_members(r, MeshDim::kDp);
            const int d = mesh.coords(r).dp;
            EXPECT_EQ(group, dp);
            EXPECT_EQ(part[0], dp[static_cast<size_t>((d / p) * p)]);
          }
        }
      }
    }
  }
  DeviceMesh mesh({.dp = 4, .pp = 1, .cp = 1, .tp = 2}, 8);  // dp ranks of tp 0: 0 2 4 6
  EXPECT_EQ(mesh.mics_partition_group(4, 2), (std::vector<int>{4, 6}));
  EXPECT_EQ(mesh.mics_replica_group(4, 2), (std::vector<int>{0, 4}));
  EXPECT_EQ(mesh.mics_replica_group(7, 2), (std::vector<int>{3, 7}));
  // dp 2 × cp 2 × tp 2, default order: rank = tp + 2·cp + 4·dp; the dp·cp group of tp 0 is
  // 0 2 4 6 (cp inner), so a partition of 2 is one cp group and a replica spans the dp ranks.
  DeviceMesh cp_mesh({.dp = 2, .pp = 1, .cp = 2, .tp = 2}, 8);
  EXPECT_EQ(cp_mesh.dp_cp_group(4), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(cp_mesh.mics_partition_group(4, 2), (std::vector<int>{4, 6}));
  EXPECT_EQ(cp_mesh.mics_partition_group(2, 2), (std::vector<int>{0, 2}));
  EXPECT_EQ(cp_mesh.mics_replica_group(4, 2), (std::vector<int>{0, 4}));
  EXPECT_EQ(cp_mesh.mics_replica_group(7, 2), (std::vector<int>{3, 7}));
  EXPECT_EQ(cp_mesh.mics_partition_group(7, 4), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(cp_mesh.mics_replica_group(7, 4), (std::vector<int>{7}));
  EXPECT_EQ(cp_mesh.mics_replica_group(5, 1), (std::vector<int>{1, 3, 5, 7}));
  // cp outside dp: rank = tp + 2·dp + 4·cp; the dp·cp group of tp 1 is 1 3 5 7 as well, and
  // a partition of 2 is now one dp group.
  DeviceMesh dp_inner({.dp = 2, .pp = 1, .cp = 2, .tp = 2}, 8, "tp-dp-cp-pp");
  EXPECT_EQ(dp_inner.mics_partition_group(5, 2), (std::vector<int>{5, 7}));
  EXPECT_EQ(dp_inner.coords(5).cp, dp_inner.coords(7).cp);
}

TEST(Mesh, ConfigurationErrorsNameTheKey) {
  EXPECT_EQ(config_error([] { DeviceMesh({.dp = 4}, 8); }),
            "parallel: parallel.dp 4 x parallel.pp 1 x parallel.cp 1 x parallel.tp 1 = 4 does not "
            "equal the "
            "world size 8 (ranks launched)");
  EXPECT_EQ(config_error([] { DeviceMesh({.dp = 2, .tp = 0}, 2); }),
            "parallel.tp: must be >= 1, got 0");
  EXPECT_NE(config_error([] {
              DeviceMesh({}, 1, "tp-xp-dp-pp");
            }).find("parallel.order: unknown dimension 'xp'"),
            std::string::npos);
  EXPECT_NE(config_error([] { DeviceMesh({}, 1, "tp-tp-dp-pp"); }).find("appears twice"),
            std::string::npos);
  EXPECT_NE(config_error([] { DeviceMesh({}, 1, "tp-dp-pp"); }).find("must name all four"),
            std::string::npos);
  EXPECT_NE(config_error([] { DeviceMesh({}, 1, ""); }).find("parallel.order"), std::string::npos);
  DeviceMesh mesh({.dp = 4}, 4);
  EXPECT_EQ(config_error([&] { mesh.check_mics_partition_size(3); }),
            "parallel.mics_partition_size: 3 does not divide parallel.dp 4");
  EXPECT_EQ(config_error([&] { mesh.mics_replica_group(0, 0); }),
            "parallel.mics_partition_size: must be >= 1, got 0");
  DeviceMesh cp_mesh({.dp = 2, .cp = 2}, 4);
  EXPECT_EQ(config_error([&] { cp_mesh.mics_partition_group(0, 3); }),
            "parallel.mics_partition_size: 3 does not divide parallel.dp 2 × parallel.cp 2 = 4");
  EXPECT_NO_THROW(cp_mesh.check_mics_partition_size(4));
  EXPECT_THROW(mesh.coords(4), Error);
  EXPECT_THROW(mesh.rank_of({.dp = 4}), Error);
}

}  // namespace
}  // namespace loom::parallel
