// parallel/sdp/neuron_masking.h — what SDP's two neuron-level regimes share (subnetwork data
// parallelism, arXiv 2507.09029; docs/parallel.md, "SDP"): the base of worker w's linear
// factories (NeuronMaskingLinear: the units w holds per block, parallel/sdp/assignment.h; every
// other layer the single-device one) and the helpers that pack, place and initialise the held
// units' rows or columns. Forward masking (parallel/sdp/forward_masking.h, ForwardMaskingLinear):
// the blocks' MLPs keep only the hidden units w holds, packed into smaller dense weights; the
// GEMMs, the hidden activations, the gradients and hence the optimiser state really shrink: no
// mask is multiplied and nothing is communicated in forward or backward. Backward masking
// (parallel/sdp/backward_masking.h, BackwardMaskingLinear): the full forward, with weight
// gradients and parameters only for the owned units. The heads option packs (forward masking)
// or splits (backward masking) each block's attention at the kv groups the worker holds of a
// second cover. Everything else (attention without the heads option, embeddings, norms, the
// head) is built as on one device. These files only build layers: the gradient sync over holder
// sets is parallel/sdp/slice_sync.h, and parallel/sdp/sdp_sync.h with train/plan.cpp compose
// them (Note [SDP plan] in parallel/sdp/sdp_engine.h).
//
// Note [SDP packed init]: init() draws the full matrix exactly as Linear::init does (one randn
// of the full shape from the same generator) and keeps the owned rows or columns, so a worker's
// packed weights are the corresponding rows/columns of the single-process model's and the
// generator advances identically on every worker (later layers draw the same values).
//
// Note [SDP placements]: a packed weight's Placement splits its packed dim (0 for the column layer
// and its bias, 1 for the row layer) over the axis "sdp" with one run per owned range (local →
// global, ascending), so core/tensor_piece.h names exactly the global elements it holds (piece_of).
// What Placement cannot say: that each run is also held by k − 1 other workers, and by which (its
// holder set). Its `replicated` list means "every rank along the axis holds the same values", and a
// split means "the ranks along the axis hold disjoint runs"; SDP's runs are neither. "sdp" is not a
// mesh axis: the SDP workers are the dp group, so data parallelism's marking would add "dp" to
// `replicated` and the global norm (parallel/gradients.h) would count only dp rank 0's slices.
// Counting each slice once needs holder information on the run (e.g. a holder list per
// PlacementRun, a run counted by its lowest holder) or a weight of 1/k per split run; neither
// exists yet. Checkpoints need the same: which holder writes a slice. The replicated bias of the
// row layer carries no placement (whole), like a default Linear's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/build_context.h"
#include "parallel/sdp/assignment.h"

namespace loom::parallel::sdp {

// The axis name of a packed weight's split (Note [SDP placements]); not a mesh axis.
inline constexpr const char* kAxisSdp = "sdp";

// Units [first, second) of a layer; a packed layer's ranges are ascending and disjoint.
using UnitRanges = std::vector<std::pair<int64_t, int64_t>>;

// The packed layers' helpers (parallel/sdp/forward_masking.cpp, backward_masking.cpp).
// The number of units in `ranges`.
int64_t count_of(const UnitRanges& ranges);
// Checks that `ranges` are non-empty, ascending, disjoint and within [0, units).
void check_ranges(const UnitRanges& ranges, int64_t units, const char* what);
// dst ← src (the same shape), outside autograd.
void assign(Tensor dst, const Tensor& src, const char* what);
// The ranges of dim `dim` of `full`, concatenated in order (what packing keeps, Note [SDP packed
// init]).
Tensor keep_units(const Tensor& full, int64_t dim, const UnitRanges& ranges);
// Note [SDP placements]: dim `dim` of t holds `ranges` of a global dim of `units`, in order.
void place_packed(Tensor& t, int64_t dim, int64_t units, const UnitRanges& ranges);
// Zeroes the rows (dim 0) of t whose global index is ≥ global_row, t holding `ranges` of the
// global rows in order.
void zero_packed_rows(Tensor& t, const UnitRanges& ranges, int64_t global_row);
// Zeroes rows [global_row, rows) of t (all its rows are global); nothing when t is undefined.
void zero_rows(Tensor& t, int64_t global_row);

// What the two neuron-level factories (forward and backward masking) share: worker `worker` of
// `assignment` (checked at construction), every layer but mlp_in / mlp_out the single-device
// one, and the units the worker holds per block. `what` names the factory in errors.
class NeuronMaskingLinear : public LinearFactory {
 public:
  int feature_split() const override { return 1; }
  std::unique_ptr<LinearLayer> column(int64_t in, const std::vector<int64_t>& segments, bool bias,
                                      DType dtype, Device device) const override;
  std::unique_ptr<LinearLayer> row(int64_t in, int64_t out, bool bias, DType dtype,
                                   Device device) const override;
  std::unique_ptr<EmbeddingLayer> vocab_embedding(int64_t rows, int64_t dim, DType dtype,
                                                  Device device) const override;
  Tensor replicated_param(const Tensor& p) const override { return p; }
  // Every worker computes every head (the heads option and q/k norms are refused together:
  // parallel/sdp/options.cpp).
  Tensor head_param(const Tensor& p) const override { return p; }
  Tensor column_input(const Tensor& x) const override { return x; }

  int worker() const { return worker_; }
  const NeuronAssignment& assignment() const { return assignment_; }
  // The units this worker holds (forward masking: keeps; backward masking: trains) in block
  // `layer`, as ranges (checked against `hidden`).
  UnitRanges owned_ranges(int64_t layer, int64_t hidden) const;
  // The heads cover, or null without the heads option.
  const NeuronAssignment* heads() const { return heads_ ? &*heads_ : nullptr; }

 protected:
  // `heads` (optional) must have the same workers and replication as `assignment`.
  NeuronMaskingLinear(NeuronAssignment assignment, int worker, const char* what,
                      std::optional<NeuronAssignment> heads = {});
  // With the heads option: the fused qkv rows (segments {q, k, v}, k = v dividing q) of the kv
  // groups this worker holds in block `layer` of the heads cover, q rows, then k, then v rows,
  // each ascending (Note [SDP packed heads] in parallel/sdp/forward_masking.h); and the proj
  // columns (`in` = q) of their query heads. Errors name the block and the sizes.
  UnitRanges head_rows(int64_t layer, const std::vector<int64_t>& segments) const;
  UnitRanges head_columns(int64_t layer, int64_t in) const;

 private:
  // Layer `layer` of the heads cover (checked to be one of its layers).
  const LayerCover& head_cover(int64_t layer) const;

  NeuronAssignment assignment_;
  int worker_;
  const char* what_;
  std::shared_ptr<const LinearFactory> plain_;  // the single-device layers
  std::optional<NeuronAssignment> heads_;
};

}  // namespace loom::parallel::sdp
