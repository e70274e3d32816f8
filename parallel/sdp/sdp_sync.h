// parallel/sdp/sdp_sync.h — SdpSync: what the training plan needs of SDP forward masking at the
// neuron level (subnetwork data parallelism, arXiv 2507.09029; docs/parallel.md, "SDP"): from a
// worker's model built with forward_masking_context (parallel/sdp/packed_layers.h) it makes the
// slice list of the gradient sync (a SliceSync over the dp group), finishes the sync each step
// and computes the global Σ g² counting every element once. The cover is the caller's
// (assignment.h); nothing here builds a model.
//
// Note [SDP gradient slices]: for block l and every slice s of layer l this worker holds, each
// packed MLP parameter of the block contributes one sync slice: the rows of s in fc/gate/up's
// weight (and fc's bias), the columns of s in proj/down's weight (a strided view). Ids are
// global and the same on every rank: ordered by (n_layer − 1 − l, s, parameter position in the
// block), so the last block's slices — whose gradients backward finishes first — come first; the
// holders are those of slice s in the cover. Every other parameter (attention, embeddings,
// norms, the proj/down bias, the head) is replicated: one slice held by all N workers, ids
// after the packed ones in the model's parameter order. So the replicated gradients become the
// plain data-parallel average over N, and each slice the average over its k holders.
//
// Note [SDP finish-time sync]: v1 synchronises after backward (finish(), no overlap with
// backward). Each parameter's gradient is copied into a persistent buffer the SliceSync reads
// and writes, and .grad is pointed at it; the plan's zero_grad clears .grad as usual, so
// backward allocates fresh gradients and accumulation over micro-batches is unchanged. The
// cost: one copy of each gradient per step, and the buffers beside backward's gradients until
// the next zero_grad (twice the gradient memory at the peak); launching each slice from its
// grad-ready hook, accumulating into the buffers, would remove both (not built yet).
//
// Note [SDP global norm]: Σ g² counts each element of the full model's gradient once: the
// replicated parameters on dp rank 0 only, each slice on its lowest holder only; then one sum
// over the dp group. Since replicated gradients and each slice are equal on all their holders
// after the sync, this is the Σ g² of the (virtual) full model's averaged gradient. At coverage
// 1 every slice's lowest holder is rank 0, and the sum is data parallelism's.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/sdp/assignment.h"
#include "parallel/sdp/slice_sync.h"

namespace loom::parallel::sdp {

// One sync slice of a packed parameter, or a whole replicated parameter (Note [SDP gradient
// slices]).
struct SdpSliceSpec {
  int64_t id = 0;
  size_t param = 0;          // index into the named parameters
  int64_t dim = 0;           // the packed dim (unused when whole)
  int64_t local_begin = 0;   // the slice's first index along dim in the packed tensor
  int64_t length = -1;       // -1: the whole parameter (replicated)
  std::vector<int> holders;  // ascending
};

// The slices of `params` (this worker's model, as named_parameters() lists it: packed MLP
// parameters are recognised by their split over kAxisSdp, their block by the "blocks.<l>."
// prefix), in ascending id. Pure: unit-testable without communication. Errors name the
// parameter when a packed run does not cover whole slices of the cover.
std::vector<SdpSliceSpec> sdp_slices(const NeuronAssignment& cover, int worker,
                                     const std::vector<std::pair<std::string, Tensor>>& params);

class SdpSync {
 public:
  // Collective over `dp` (N = cover.workers ranks; this rank is worker dp.rank()).
  SdpSync(Communicator& dp, NeuronAssignment cover,
          std::vector<std::pair<std::string, Tensor>> params, SliceSyncOptions options = {});
  ~SdpSync();

  // Note [SDP finish-time sync]: every gradient becomes its holders' average.
  void finish();
  // Note [SDP global norm]: a 0-d f64 tensor on `device`, the same on every rank. Collective.
  Tensor grad_sq_sum(Device device) const;
  const NeuronAssignment& cover() const { return cover_; }
  int worker() const { return worker_; }
  const std::vector<SdpSliceSpec>& slices() const { return specs_; }
  std::string describe() const;

 private:
  Communicator& dp_;
  NeuronAssignment cover_;
  int worker_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<Tensor> buffers_;  // per parameter: the persistent gradient
  std::vector<SdpSliceSpec> specs_;
  std::unique_ptr<SliceSync> sync_;
};

}  // namespace loom::parallel::sdp
