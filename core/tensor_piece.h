// core/tensor_piece.h — TensorPiece: which elements of a global (layout-free) tensor one rank's
// tensor holds, and the copy of the elements two pieces share. This is what makes a checkpoint
// reshardable: every stored tensor says which piece of its global tensor it is, and a run with
// any other layout fills each of its own pieces from whichever stored pieces overlap it
// (Note [Pieces]). Pure arithmetic over host memory: nothing here reads files or communicates.
//
// Note [Pieces]: a piece of a global tensor of shape G is a box, then a flat range of the box:
//   box    per dim d, a list of runs (local index → global index, length) whose lengths add up
//          to the local size of d; a dim without runs is whole. A tensor-parallel part is one
//          run on its split dim (a fused qkv part one run per segment: Note [Placement] in
//          core/placement.h), a whole tensor has no runs;
//   range  [begin, end) of the box's elements in row-major order: a ZeRO shard of a parameter
//          (parallel/dp) is such a range of the rank's part; a whole part is [0, numel).
// The piece's values are those end − begin elements, contiguous. Two pieces overlap where a
// global element lies in both; for_each_overlap walks the overlap as contiguous runs of both,
// so copying, and finding which bytes of a stored piece a read needs, cost one step per row of
// the destination's box.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/placement.h"
#include "core/tensor.h"

namespace loom {

struct TensorPiece {
  Shape global_shape;
  std::vector<std::vector<PlacementRun>> runs;  // per dim; empty: the whole dim
  int64_t begin = 0, end = 0;                   // flat range of the box

  Shape box_shape() const;  // the local tensor's shape
  int64_t numel() const { return end - begin; }
  bool operator==(const TensorPiece&) const = default;
};

// One tensor this rank holds as a piece of a global tensor: a parameter (whole, a tensor-parallel
// part, a ZeRO shard), its gradient, or an optimizer state tensor. What the engines list
// (parallel/engine.h), the global norm sums and checkpoints store.
struct HeldPiece {
  std::string name;     // the optimizer's name for it (its state is "<kind>.<name>"), or the key
  std::string param;    // the global parameter's name
  Tensor values;        // this rank's values (a view)
  TensorPiece piece;    // which elements of the global tensor they are
  Placement placement;  // which ranks hold the same values, and whose copy counts
};

// A piece for each tensor: the whole local tensor under its placement.
HeldPiece held_whole(const std::string& param, const Tensor& t);

// The piece a tensor of `local_shape` with placement `pl` holds (an empty placement: the whole
// tensor), restricted to the flat range [begin, end) of it (end < 0: to its last element).
// Checks that the placement's runs tile the local shape.
TensorPiece piece_of(const Placement& pl, const Shape& local_shape, int64_t begin = 0,
                     int64_t end = -1);
TensorPiece whole_piece(const Shape& global_shape);

// "shape=768,2304;d0=0@0+256,256@768+256;flat=0-196608": what checkpoints store. parse_piece
// throws naming `what` on malformed text.
std::string piece_str(const TensorPiece& p);
TensorPiece parse_piece(const std::string& text, const std::string& what);

// Calls fn(src_index, dst_index, count) for every maximal run of elements both pieces hold,
// indices counted from each piece's begin. Requires equal global shapes.
void for_each_overlap(
    const TensorPiece& src, const TensorPiece& dst,
    const std::function<void(int64_t src_index, int64_t dst_index, int64_t count)>& fn);

// Copies every element dst shares with src (elem_bytes each); returns how many.
int64_t copy_overlap(const TensorPiece& src, const void* src_data, const TensorPiece& dst,
                     void* dst_data, size_t elem_bytes);

}  // namespace loom
