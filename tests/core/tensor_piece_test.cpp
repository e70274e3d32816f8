// tests/core/tensor_piece_test.cpp — TensorPiece (core/tensor_piece.h): random global tensors cut
// by one random layout (a split dim with segments, like a fused qkv part, then ZeRO flat ranges of
// each part) are copied into the pieces of another random layout; every destination element must be
// filled exactly once with the value a brute-force, element-by-element mapping gives. Also the
// text form's round trip and its errors, and what a piece that is not covered reports.
#include "core/tensor_piece.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace loom {
namespace {

// One layout: `parts` parts of dim `dim` (each the concatenation of its chunk of every one of
// `segments` equal segments), each part cut into `ranges` flat ranges at random points.
std::vector<TensorPiece> random_layout(const Shape& g, std::mt19937& rng) {
  std::vector<TensorPiece> out;
  const size_t nd = g.size();
  auto pick = [&](int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(rng); };
  std::vector<Placement> parts;
  if (nd == 0 || pick(4) == 0) {
    parts.push_back(Placement{});  // whole
  } else {
    const int64_t dim = pick(static_cast<int64_t>(nd));
    // segments × parts must divide the dim: choose among the divisors.
    std::vector<std::pair<int64_t, int64_t>> choices;
    for (int64_t s = 1; s <= g[dim]; ++s) {
      for (int64_t p = 1; p * s <= g[dim]; ++p) {
        if (g[dim] % (s * p) == 0) choices.emplace_back(s, p);
      }
    }
    const auto [segments, n] =
        choices[static_cast<size_t>(pick(static_cast<int64_t>(choices.size())))];
    const int64_t seg = g[dim] / segments, chunk = seg / n;
    for (int64_t r = 0; r < n; ++r) {
      Placement pl;
      pl.global_shape = g;
      PlacementSplit s;
      s.dim = dim;
      s.axis = "tp";
      for (int64_t k = 0; k < segments; ++k)
        s.runs.push_back({k * chunk, k * seg + r * chunk, chunk});
      pl.splits.push_back(s);
      parts.push_back(pl);
    }
  }
  for (const Placement& pl : parts) {
    Shape local = g;
    if (!pl.splits.empty()) {
      int64_t n = 0;
      for (const PlacementRun& r : pl.splits[0].runs) n += r.length;
      local[static_cast<size_t>(pl.splits[0].dim)] = n;
    }
    const int64_t numel = shape_numel(local);
    std::vector<int64_t> cuts = {0, numel};
    for (int64_t k = pick(4); k > 0; --k) cuts.push_back(pick(numel + 1));
    std::sort(cuts.begin(), cuts.end());
    for (size_t i = 0; i + 1 < cuts.size(); ++i)
      out.push_back(piece_of(pl, local, cuts[i], cuts[i + 1]));
  }
  return out;
}

// The global flat index of every element of a piece, one element at a time.
std::vector<int64_t> global_indices(const TensorPiece& p) {
  const Shape box = p.box_shape();
  std::vector<int64_t> out;
  for (int64_t i = p.begin; i < p.end; ++i) {
    int64_t rem = i, flat = 0, stride = 1;
    std::vector<int64_t> global(box.size());
    for (size_t d = box.size(); d-- > 0;) {
      const int64_t local = rem % box[d];
      rem /= box[d];
      int64_t g = local;
      for (const PlacementRun& r : p.runs[d]) {
        if (local >= r.local && local < r.local + r.length) g = r.global + local - r.local;
      }
      global[d] = g;
    }
    for (size_t d = box.size(); d-- > 0;) {
      flat += global[d] * stride;
      stride *= p.global_shape[d];
    }
    out.push_back(flat);
  }
  return out;
}

TEST(Pieces, AnyLayoutFillsAnyOtherExactly) {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 400; ++trial) {
    Shape g;
    const int nd = std::uniform_int_distribution<int>(0, 3)(rng);
    for (int d = 0; d < nd; ++d) g.push_back(std::uniform_int_distribution<int64_t>(1, 12)(rng));
    SCOPED_TRACE("trial " + std::to_string(trial) + " shape " + shape_str(g));
    const std::vector<TensorPiece> src = random_layout(g, rng), dst = random_layout(g, rng);
    // Source values: each element's global index (+ 0.5, so 0 is not a valid value).
    std::vector<std::vector<double>> src_data;
    for (const TensorPiece& p : src) {
      std::vector<double> v;
      for (int64_t i : global_indices(p)) v.push_back(static_cast<double>(i) + 0.5);
      src_data.push_back(v);
    }
    for (const TensorPiece& d : dst) {
      std::vector<double> got(static_cast<size_t>(d.numel()), 0.0);
      int64_t copied = 0;
      for (size_t k = 0; k < src.size(); ++k)
        copied += copy_overlap(src[k], src_data[k].data(), d, got.data(), sizeof(double));
      ASSERT_EQ(copied, d.numel()) << piece_str(d);  // the source pieces tile the tensor once
      std::vector<double> want;
      for (int64_t i : global_indices(d)) want.push_back(static_cast<double>(i) + 0.5);
      ASSERT_EQ(got, want) << piece_str(d);
    }
  }
}

TEST(Pieces, TextRoundTripsAndBadTextIsNamed) {
  Placement pl;
  pl.global_shape = {6, 4};
  pl.splits.push_back({0, "tp", {{0, 0, 1}, {1, 2, 1}, {2, 4, 1}}});
  const TensorPiece p = piece_of(pl, {3, 4}, 2, 9);
  EXPECT_EQ(piece_str(p), "shape=6,4;d0=0@0+1,1@2+1,2@4+1;flat=2-9");
  EXPECT_EQ(parse_piece(piece_str(p), "t"), p);
  EXPECT_EQ(parse_piece(piece_str(whole_piece({})), "t"), whole_piece({}));
  for (const std::string bad :
       {"shape=6,4;flat=0-25", "shape=6,4;d0=0@4+3;flat=0-1", "shape=6;flat=0", "shape=x;flat=0-1",
        "flat=0-1", "shape=6;d3=0@0+1;flat=0-1", "shape=6;color=red;flat=0-1"}) {
    try {
      parse_piece(bad, "file.safetensors: 'w'");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("file.safetensors: 'w'"), std::string::npos) << e.what();
    }
  }
}

TEST(Pieces, UncoveredElementsAreNotCopied) {
  // The first half of a (4, 3) tensor's rows cannot fill the whole tensor.
  Placement half;
  half.global_shape = {4, 3};
  half.splits.push_back({0, "tp", {{0, 0, 2}}});
  const TensorPiece src = piece_of(half, {2, 3});
  const std::vector<double> values(6, 1.0);
  std::vector<double> dst(12, 0.0);
  EXPECT_EQ(copy_overlap(src, values.data(), whole_piece({4, 3}), dst.data(), sizeof(double)), 6);
  EXPECT_EQ(dst, (std::vector<double>{1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_THROW(copy_overlap(src, values.data(), whole_piece({4, 4}), dst.data(), sizeof(double)),
               Error);
}

}  // namespace
}  // namespace loom
