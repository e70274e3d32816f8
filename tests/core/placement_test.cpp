// tests/core/placement_test.cpp — Placement on a tensor (core/placement.h): unset it is the whole
// tensor; set_placement checks the runs against the tensor and the global shape; replicated axes
// are added once and never for an axis the tensor is split over; the handle keeps it, views do not.
#include "core/placement.h"

#include <gtest/gtest.h>

#include "core/tensor.h"

namespace loom {
namespace {

TEST(Placement, UnsetIsTheWholeTensor) {
  Tensor t = Tensor::zeros({3, 4});
  EXPECT_FALSE(t.has_placement());
  const Placement p = t.placement();
  EXPECT_EQ(p.global_shape, (Shape{3, 4}));
  EXPECT_TRUE(p.splits.empty());
  EXPECT_TRUE(p.replicated.empty());
  EXPECT_TRUE(p.tied_to.empty());
}

TEST(Placement, RunsAreCheckedAgainstTheTensor) {
  Tensor t = Tensor::zeros({6, 4});  // rank 1 of 2 of a fused (q, k, v) weight of 12 rows
  Placement p;
  p.global_shape = {12, 4};
  p.splits.push_back({0, "tp", {{0, 2, 2}, {2, 6, 2}, {4, 10, 2}}});
  t.set_placement(p);
  EXPECT_TRUE(t.has_placement());
  EXPECT_EQ(t.placement(), p);
  EXPECT_EQ(placement_str(t.placement()),
            "global (12, 4); dim 0 over tp: 0→2 (2), 2→6 (2), 4→10 (2)");
  Tensor copy = t;  // the handle shares it
  EXPECT_TRUE(copy.has_placement());
  EXPECT_FALSE(t.narrow(0, 0, 2).has_placement());  // a view is another tensor

  Placement short_runs = p;
  short_runs.splits[0].runs.pop_back();  // 4 of 6 rows
  EXPECT_THROW(t.set_placement(short_runs), Error);
  Placement outside = p;
  outside.splits[0].runs[2].global = 11;  // past the global 12 rows
  EXPECT_THROW(t.set_placement(outside), Error);
  Placement wrong_rank = p;
  wrong_rank.global_shape = {12};
  EXPECT_THROW(t.set_placement(wrong_rank), Error);
  Placement unsplit_differs = p;
  unsplit_differs.global_shape = {12, 8};  // dim 1 is not split but differs
  EXPECT_THROW(t.set_placement(unsplit_differs), Error);
}

TEST(Placement, ReplicatedAxesAreAddedOnceAndNeverWhereSplit) {
  Placement p;
  p.global_shape = {4};
  p.splits.push_back({0, "tp", {{0, 0, 4}}});
  p.add_replicated("dp");
  p.add_replicated("dp");
  p.add_replicated("tp");  // split over tp: not replicated there
  EXPECT_EQ(p.replicated, (std::vector<std::string>{"dp"}));
  EXPECT_TRUE(p.is_replicated_over("dp"));
  EXPECT_FALSE(p.is_replicated_over("tp"));
  EXPECT_NE(p.split_over("tp"), nullptr);
  EXPECT_EQ(p.split_over("cp"), nullptr);
  p.add_replicated("cp");
  p.remove_replicated("dp");
  EXPECT_EQ(p.replicated, (std::vector<std::string>{"cp"}));
  p.tied_to = "wte.weight";
  EXPECT_EQ(placement_str(p),
            "global (4); dim 0 over tp: 0→0 (4); replicated over cp; tied to wte.weight");
}

}  // namespace
}  // namespace loom
