// tests/parallel/mesh_test.cpp — DeviceMesh arithmetic in one process, no MPI: coordinates
// round-trip for every rank of many shapes and every rank order, each axis's (and each axis
// pair's) groups partition the world, the default order keeps tp groups contiguous, MiCS
// partition and replica groups, a fork's extra axis, and the configuration errors name their
// keys.
#include "parallel/mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>

#include "core/error.h"

namespace loom::parallel {
namespace {

const char* const kDims[] = {kAxisDp, kAxisPp, kAxisCp, kAxisTp};

int size_of(const MeshShape& s, const std::string& axis) {
  return axis == kAxisDp ? s.dp : axis == kAxisPp ? s.pp : axis == kAxisCp ? s.cp : s.tp;
}

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

const Axes kDpCp = {kAxisDp, kAxisCp};

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
        const std::vector<int> c = mesh.coords(r);
        for (const char* d : kDims) {
          ASSERT_GE(mesh.coord(r, d), 0);
          ASSERT_LT(mesh.coord(r, d), size_of(s, d));
        }
        ASSERT_EQ(mesh.rank_of(c), r) << mesh.str();
        seen.insert(c);
      }
      EXPECT_EQ(static_cast<int>(seen.size()), mesh.world_size()) << mesh.str();
      EXPECT_EQ(mesh.order_str(), order);
    }
  }
}

// Every axis alone and every pair of axes: the groups partition the world, a group varies only
// along its axes (every other coordinate shared), is in world-rank order, and along one axis
// its rank i has coordinate i.
TEST(Mesh, GroupsPartitionTheWorldAlongEveryAxisSet) {
  std::vector<Axes> sets;
  for (const char* a : kDims) {
    sets.push_back({a});
    for (const char* b : kDims) {
      if (std::string(a) < b) sets.push_back({a, b});
    }
  }
  for (const MeshShape& s : shapes(16)) {
    for (const std::string& order : {std::string(kDefaultMeshOrder), std::string("pp-dp-tp-cp")}) {
      DeviceMesh mesh(s, s.product(), order);
      for (const Axes& axes : sets) {
        int n = 1;
        for (const std::string& a : axes) n *= size_of(s, a);
        std::vector<int> owner(static_cast<size_t>(mesh.world_size()), -1);
        const auto groups = mesh.groups(axes);
        ASSERT_EQ(static_cast<int>(groups.size()), mesh.world_size() / n);
        for (size_t g = 0; g < groups.size(); ++g) {
          ASSERT_EQ(static_cast<int>(groups[g].size()), n);
          EXPECT_TRUE(std::is_sorted(groups[g].begin(), groups[g].end()));
          for (size_t i = 0; i < groups[g].size(); ++i) {
            const int r = groups[g][i];
            ASSERT_EQ(owner[static_cast<size_t>(r)], -1) << "rank " << r << " in two groups";
            owner[static_cast<size_t>(r)] = static_cast<int>(g);
            if (axes.size() == 1) {
              EXPECT_EQ(mesh.coord(r, axes[0]), static_cast<int>(i));  // group rank = coordinate
            }
            for (const char* d : kDims) {
              if (std::find(axes.begin(), axes.end(), d) != axes.end()) continue;
              EXPECT_EQ(mesh.coord(r, d), mesh.coord(groups[g][0], d));  // the others shared
            }
            EXPECT_EQ(mesh.group_members(r, axes), groups[g]);
          }
        }
        EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
      }
    }
  }
}

// A fork's own axis (an outer local-SGD axis, say) needs no new member anywhere: it is listed.
TEST(Mesh, AnExtraAxisIsOnlyListed) {
  DeviceMesh mesh({{kAxisTp, 2}, {kAxisCp, 1}, {kAxisDp, 2}, {kAxisPp, 1}, {"outer", 3}}, 12);
  EXPECT_EQ(mesh.size("outer"), 3);
  EXPECT_EQ(mesh.stride("outer"), 4);
  EXPECT_EQ(mesh.coord(9, "outer"), 2);
  EXPECT_EQ(mesh.group_members(9, {"outer"}), (std::vector<int>{1, 5, 9}));
  EXPECT_EQ(mesh.group_members(9, {"dp", "outer"}), (std::vector<int>{1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(mesh.group_members(9, {}), (std::vector<int>{9}));
  EXPECT_EQ(mesh.order_str(), "tp-cp-dp-pp-outer");
  EXPECT_THROW(mesh.size("xp"), Error);
}

TEST(Mesh, DefaultOrderKeepsTensorParallelGroupsContiguous) {
  for (const MeshShape& s : shapes(16)) {
    DeviceMesh mesh(s, s.product());
    EXPECT_EQ(mesh.stride(kAxisTp), 1);
    EXPECT_EQ(mesh.stride(kAxisCp), s.tp);
    EXPECT_EQ(mesh.stride(kAxisDp), s.tp * s.cp);
    EXPECT_EQ(mesh.stride(kAxisPp), s.tp * s.cp * s.dp);
    for (int r = 0; r < mesh.world_size(); ++r) {
      const auto tp = mesh.group_members(r, {kAxisTp});
      for (int i = 0; i < s.tp; ++i) EXPECT_EQ(tp[static_cast<size_t>(i)], (r / s.tp) * s.tp + i);
    }
  }
}

TEST(Mesh, WorkedExample) {
  // dp=2 pp=2 cp=1 tp=2, default order: rank = tp + 2·dp + 4·pp.
  DeviceMesh mesh(MeshShape{.dp = 2, .pp = 2, .cp = 1, .tp = 2}, 8);
  EXPECT_EQ(mesh.coords(5), (std::vector<int>{1, 0, 0, 1}));  // tp cp dp pp
  EXPECT_EQ(mesh.coords(6), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(mesh.group_members(5, {kAxisTp}), (std::vector<int>{4, 5}));
  EXPECT_EQ(mesh.group_members(5, {kAxisDp}), (std::vector<int>{5, 7}));
  EXPECT_EQ(mesh.group_members(5, {kAxisPp}), (std::vector<int>{1, 5}));
  EXPECT_EQ(mesh.group_members(5, {kAxisCp}), (std::vector<int>{5}));
  EXPECT_EQ(mesh.group_members(5, {kAxisTp, kAxisPp}), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(mesh.str(), "tp=2 cp=1 dp=2 pp=2 order=tp-cp-dp-pp (8 ranks)");
  // dp innermost instead: rank = dp + 2·tp + 4·pp.
  DeviceMesh dp_first(MeshShape{.dp = 2, .pp = 2, .cp = 1, .tp = 2}, 8, "dp-tp-cp-pp");
  EXPECT_EQ(dp_first.group_members(5, {kAxisDp}), (std::vector<int>{4, 5}));
  EXPECT_EQ(dp_first.group_members(5, {kAxisTp}), (std::vector<int>{5, 7}));
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
          const auto part = mesh.partition_group(r, kDpCp, p);
          const auto repl = mesh.replica_group(r, kDpCp, p);
          const auto group = mesh.group_members(r, kDpCp);
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
            EXPECT_EQ(mesh.coord(q, kAxisTp), mesh.coord(r, kAxisTp));
            EXPECT_EQ(mesh.coord(q, kAxisPp), mesh.coord(r, kAxisPp));
          }
          if (s.cp == 1) {  // the dp group, P consecutive dp coordinates
            const auto dp = mesh.group_members(r, {kAxisDp});
            const int d = mesh.coord(r, kAxisDp);
            EXPECT_EQ(group, dp);
            EXPECT_EQ(part[0], dp[static_cast<size_t>((d / p) * p)]);
          }
        }
      }
    }
  }
  DeviceMesh mesh(MeshShape{.dp = 4, .pp = 1, .cp = 1, .tp = 2}, 8);  // dp ranks of tp 0: 0 2 4 6
  EXPECT_EQ(mesh.partition_group(4, kDpCp, 2), (std::vector<int>{4, 6}));
  EXPECT_EQ(mesh.replica_group(4, kDpCp, 2), (std::vector<int>{0, 4}));
  EXPECT_EQ(mesh.replica_group(7, kDpCp, 2), (std::vector<int>{3, 7}));
  // dp 2 × cp 2 × tp 2, default order: rank = tp + 2·cp + 4·dp; the dp·cp group of tp 0 is
  // 0 2 4 6 (cp inner), so a partition of 2 is one cp group and a replica spans the dp ranks.
  DeviceMesh cp_mesh(MeshShape{.dp = 2, .pp = 1, .cp = 2, .tp = 2}, 8);
  EXPECT_EQ(cp_mesh.group_members(4, kDpCp), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(cp_mesh.partition_group(4, kDpCp, 2), (std::vector<int>{4, 6}));
  EXPECT_EQ(cp_mesh.partition_group(2, kDpCp, 2), (std::vector<int>{0, 2}));
  EXPECT_EQ(cp_mesh.replica_group(4, kDpCp, 2), (std::vector<int>{0, 4}));
  EXPECT_EQ(cp_mesh.replica_group(7, kDpCp, 2), (std::vector<int>{3, 7}));
  EXPECT_EQ(cp_mesh.partition_group(7, kDpCp, 4), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(cp_mesh.replica_group(7, kDpCp, 4), (std::vector<int>{7}));
  EXPECT_EQ(cp_mesh.replica_group(5, kDpCp, 1), (std::vector<int>{1, 3, 5, 7}));
  // cp outside dp: rank = tp + 2·dp + 4·cp; the dp·cp group of tp 1 is 1 3 5 7 as well, and
  // a partition of 2 is now one dp group.
  DeviceMesh dp_inner(MeshShape{.dp = 2, .pp = 1, .cp = 2, .tp = 2}, 8, "tp-dp-cp-pp");
  EXPECT_EQ(dp_inner.partition_group(5, kDpCp, 2), (std::vector<int>{5, 7}));
  EXPECT_EQ(dp_inner.coord(5, kAxisCp), dp_inner.coord(7, kAxisCp));
}

TEST(Mesh, ConfigurationErrorsNameTheKey) {
  EXPECT_EQ(config_error([] { DeviceMesh(MeshShape{.dp = 4}, 8); }),
            "parallel: parallel.tp 1 x parallel.cp 1 x parallel.dp 4 x parallel.pp 1 = 4 does not "
            "equal the world size 8 (ranks launched)");
  EXPECT_EQ(config_error([] { DeviceMesh(MeshShape{.dp = 2, .tp = 0}, 2); }),
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
  DeviceMesh mesh(MeshShape{.dp = 4}, 4);
  EXPECT_EQ(config_error([&] { mesh.check_partition_size(kDpCp, 3); }),
            "parallel.mics_partition_size: 3 does not divide parallel.dp 4");
  EXPECT_EQ(config_error([&] { mesh.replica_group(0, kDpCp, 0); }),
            "parallel.mics_partition_size: must be >= 1, got 0");
  DeviceMesh cp_mesh(MeshShape{.dp = 2, .cp = 2}, 4);
  EXPECT_EQ(config_error([&] { cp_mesh.partition_group(0, kDpCp, 3); }),
            "parallel.mics_partition_size: 3 does not divide parallel.dp 2 × parallel.cp 2 = 4");
  EXPECT_NO_THROW(cp_mesh.check_partition_size(kDpCp, 4));
  EXPECT_THROW(mesh.coords(4), Error);
  EXPECT_THROW(mesh.rank_of({0, 0, 4, 0}), Error);
  EXPECT_THROW(mesh.rank_of({0, 0}), Error);
}

}  // namespace
}  // namespace loom::parallel
