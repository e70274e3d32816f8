// parallel/diloco/island_lanes.h — IslandLanes: an island's parameters in the layout-free form its
// exchange with other islands uses (Note [Lanes]), and the moves between that form and whatever
// the island's own layout holds on each rank (dp replicas, ZeRO shards, tp parts, pp stages).
//
// Note [Lanes]: each fragment's parameters, sorted by name, flattened whole and concatenated,
// are cut into L equal ranges, one per lane: the island's ranks 0..L−1 (parallel.diloco.lanes;
// all of them by default). Lane l of every island holds the same range, so lane l of island A
// exchanges with lane l of island B alone (parallel/diloco/island_link.h), whatever layouts
// the two islands train with; islands agree on L, not on their layouts. gather() brings the
// elements every rank counts (each global element on exactly one rank of the island: Note
// [Global Σ g²] in parallel/gradients.h) to the lanes as host f32; scatter() sends the lanes'
// values back to every piece any rank holds (replicas and tied copies too). Both are one round
// of point-to-point messages over the island's world; what goes where is fixed at
// construction from every rank's pieces (all-gathered once).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/tensor_piece.h"
#include "parallel/diloco/options.h"

namespace loom::parallel {
class Communicator;
}

namespace loom::parallel::diloco {

using FragmentsOf =
    std::function<std::vector<FragmentRange>(const std::string& param, const Shape& shape)>;

// A parameter's range in a lane: elements [begin, end) of the whole flattened parameter, at
// `offset` in the lane's vector; `row` its last dimension (quantisation's row scaling).
struct LaneSegment {
  std::string param;
  Shape shape;  // the whole parameter's
  int64_t begin = 0, end = 0, offset = 0, row = 1;
};

// What a rank gives and takes: `held` every parameter piece it holds (filled by scatter),
// `counted` the pieces whose values it contributes (TensorPiece of the values' elements). Only
// their names and pieces are kept; gather and scatter take the values.
struct RankPieces {
  std::vector<HeldPiece> held;
  std::vector<HeldPiece> counted;
};

class IslandLanes {
 public:
  // world: the island's ranks (null: one rank); lanes ≥ 1; ranges: which elements of a
  // parameter (of this rank's pieces) belong to which fragment (Note [Fragments] in
  // parallel/diloco/options.h).
  IslandLanes(Communicator* world, int lanes, const RankPieces& mine, int64_t fragments,
              const FragmentsOf& ranges);

  int lane() const { return lane_; }  // this rank's lane; −1: none
  int lanes() const { return lanes_; }
  int64_t fragments() const { return static_cast<int64_t>(segments_.size()); }
  // This rank's lane's segments of fragment f (empty without a lane) and their elements.
  const std::vector<LaneSegment>& segments(int64_t f) const { return segments_[f]; }
  int64_t lane_size(int64_t f) const;
  // Where this lane's range starts in fragment f's elements (lane order: Note [Lanes]).
  int64_t lane_begin(int64_t f) const { return lane_ < 0 ? 0 : fragment_size_[f] * lane_ / lanes_; }
  // The whole fragment's elements and a digest of its parameters' names and shapes (islands
  // must train the same model).
  int64_t fragment_size(int64_t f) const { return fragment_size_[f]; }
  uint64_t model_digest() const { return digest_; }

  // Collective over the island: this lane's elements of fragment f (f32), from `counted`: the
  // pieces given at construction as they are now (the same pieces, in the same order).
  std::vector<float> gather(int64_t f, const std::vector<HeldPiece>& counted);
  // Collective: every held piece of fragment f becomes α·itself + (1 − α)·the lanes' values
  // (α = 0: the lanes' values). `values`: this lane's vector (ignored without a lane); `held`:
  // the pieces given at construction (views: written in place).
  void scatter(int64_t f, const std::vector<float>& values, double alpha,
               const std::vector<HeldPiece>& held);

 private:
  struct Desc {  // a piece as every rank knows it
    std::string param;
    TensorPiece piece;
  };
  // Calls fn(piece index, local index, lane offset, count) for every run the pieces share
  // with lane l's segments of fragment f, in the order both sides enumerate.
  void walk(const std::vector<Desc>& pieces, int lane, int64_t f,
            const std::function<void(size_t, int64_t, int64_t, int64_t)>& fn) const;
  bool touches(const Desc& d, int64_t f) const;  // whether d's parameter has elements in f

  Communicator* world_ = nullptr;
  int rank_ = 0, size_ = 1, lanes_ = 1, lane_ = 0;
  std::vector<std::vector<Desc>> held_, counted_;                    // per rank
  std::vector<std::vector<LaneSegment>> segments_;                   // this lane's, per fragment
  std::vector<std::vector<std::vector<LaneSegment>>> all_segments_;  // [lane][fragment]
  std::vector<int64_t> fragment_size_;
  std::vector<std::set<std::string>> fragment_params_;
  uint64_t digest_ = 0;
};

}  // namespace loom::parallel::diloco
