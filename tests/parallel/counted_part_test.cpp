// tests/parallel/counted_part_test.cpp — runs and tensors counted elsewhere (Note [Holders that no
// axis names] in core/placement.h): the global norm sums only the counted runs' squares, and the
// checkpoint writer's part (counted_part) holds exactly their values at their global indices,
// for random runs on either dim; a tensor counted elsewhere gives nothing.
#include <gtest/gtest.h>

#include <random>

#include "core/ops/view.h"
#include "core/rng.h"
#include "parallel/gradients.h"

namespace loom::parallel {
namespace {

TEST(CountedPart, RandomRunsOnEitherDim) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t dim = trial % 2;
    const int64_t rows = 3 + static_cast<int64_t>(rng() % 5),
                  cols = 2 + static_cast<int64_t>(rng() % 6);
    Generator gen(static_cast<uint64_t>(trial));
    const Tensor t = randn({rows, cols}, gen, DType::kF64);
    const int64_t local = dim == 0 ? rows : cols;
    // Runs of 1-3 elements tiling the local dim, placed at scattered global offsets.
    Placement pl;
    pl.global_shape = {dim == 0 ? 4 * rows : rows, dim == 1 ? 4 * cols : cols};
    PlacementSplit split{dim, "sdp", {}};
    int64_t global = static_cast<int64_t>(rng() % 3);
    for (int64_t at = 0; at < local;) {
      const int64_t len = std::min<int64_t>(local - at, 1 + static_cast<int64_t>(rng() % 3));
      split.runs.push_back({at, global, len, rng() % 2 == 0});
      global += len + static_cast<int64_t>(rng() % 3);
      at += len;
    }
    pl.splits = {split};
    const HeldPiece p{"w", "w", t, piece_of(pl, t.shape()), pl};

    double expect = 0;
    std::vector<std::pair<int64_t, int64_t>> counted;  // (local, global) indices along dim
    for (const PlacementRun& r : split.runs) {
      if (!r.counted) continue;
      for (int64_t k = 0; k < r.length; ++k) counted.emplace_back(r.local + k, r.global + k);
    }
    const std::vector<double> v = t.to_vector();
    for (const auto& [l, g] : counted) {
      for (int64_t o = 0; o < (dim == 0 ? cols : rows); ++o) {
        const double x = v[static_cast<size_t>(dim == 0 ? l * cols + o : o * cols + l)];
        expect += x * x;
      }
    }
    const double got = global_grad_sq_sum({p}, nullptr, Device::cpu()).item();
    EXPECT_NEAR(got, expect, 1e-12 * (1 + expect)) << "trial " << trial;

    const auto part = counted_part(p, nullptr);
    if (counted.empty()) {
      ASSERT_TRUE(!part || part->first.numel() == 0) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(part.has_value());
    // Every value of the part sits where the piece says: copy it into a zero global tensor and
    // compare with the original at the counted coordinates.
    const TensorPiece whole = whole_piece(Shape(pl.global_shape));
    std::vector<double> dst(static_cast<size_t>(whole.numel()), 0.0);
    const std::vector<double> src = ops::contiguous(part->first).to_vector();
    EXPECT_EQ(copy_overlap(part->second, src.data(), whole, dst.data(), sizeof(double)),
              part->first.numel());
    const int64_t gcols = pl.global_shape[1];
    for (const auto& [l, g] : counted) {
      for (int64_t o = 0; o < (dim == 0 ? cols : rows); ++o) {
        const double want = v[static_cast<size_t>(dim == 0 ? l * cols + o : o * cols + l)];
        const double have = dst[static_cast<size_t>(dim == 0 ? g * gcols + o : o * gcols + g)];
        EXPECT_EQ(have, want) << "trial " << trial;
      }
    }
  }
}

TEST(CountedPart, TensorCountedElsewhereGivesNothing) {
  Generator gen(3);
  Tensor t = randn({4, 5}, gen, DType::kF64);
  Placement pl;
  pl.global_shape = {4, 5};
  pl.counted = false;
  const HeldPiece p{"w", "w", t, piece_of(pl, t.shape()), pl};
  EXPECT_FALSE(counted_part(p, nullptr).has_value());
  EXPECT_EQ(global_grad_sq_sum({p}, nullptr, Device::cpu()).item(), 0.0);
  pl.counted = true;
  const HeldPiece q{"w", "w", t, piece_of(pl, t.shape()), pl};
  ASSERT_TRUE(counted_part(q, nullptr).has_value());
  EXPECT_GT(global_grad_sq_sum({q}, nullptr, Device::cpu()).item(), 0.0);
}

}  // namespace
}  // namespace loom::parallel
