// parallel/sdp/sdp_sync.h — SdpSync: what the training plan needs of SDP (subnetwork data
// parallelism, arXiv 2507.09029; docs/parallel.md, "SDP") at either level and in either regime:
// from a worker's model (built by parallel/sdp/forward_masking.h, backward_masking.h or
// parallel/sdp/block_level.h) and its slice list (SdpSetup, Note [SDP setup]) it runs the
// gradient sync over holder sets (a SliceSync over the dp group) overlapped with backward,
// computes the global Σ g² counting every element once, says which rank stores each slice in a
// checkpoint, and under backward masking publishes the updated slices to the workers that keep a
// frozen copy. The cover is the caller's (assignment.h); nothing here builds a model.
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
// Note [SDP overlapped sync]: the sync runs while backward continues. zero_grad() zeroes one
// persistent buffer per parameter and points .grad at it, so backward accumulates into the
// memory the SliceSync's views name (AccumulateGrad adds in place into a defined .grad); each
// parameter's grad-ready hook (core/autograd.h, Note [Gradient-ready hooks]) counts the
// backwards of the step and, at the micro_batches-th, launches the parameter's slices: their
// gradient is final. SliceSync issues a holder set's buckets in ascending id, and the ids run in
// the order backward finishes the blocks (Note [SDP gradient slices]), so the last block's
// averages are on the wire while the earlier blocks' backward runs. finish() (from
// the engine's finish()) launches what no hook launched (a parameter that got no gradient in some
// micro-batch: its buffer keeps the zeros or the partial sum), waits, and the averages land in
// the buffers, which are the gradients: no per-step copy and no second gradient copy beside
// backward's. Counting instead of a "last micro-batch" flag keeps the step runner unaware of SDP:
// a parameter fires at most once per backward, so the micro_batches-th firing is the last; a
// further backward before finish() is an error naming the parameter. If .grad was cleared
// behind SdpSync's back (a zero_grad other than this one), the hook copies the fresh gradient
// into the buffer and points .grad back, as GradBuckets does; finish() does the same for a
// parameter whose hook never fired. events() lists the step's hooks and launches in order: the
// tests prove the overlap from it (a launch before an earlier block's hook).
//
// Note [SDP global norm]: Σ g² counts each element of the full model's gradient once: the
// replicated parameters on dp rank 0 only, each slice on its lowest holder of copy 0 only
// (counts()); SdpEngine writes that into the placements (Note [SDP checkpoints] in
// parallel/sdp/sdp_engine.h) and the one norm of parallel/gradients.h sums over the world. Since
// replicated gradients and each slice are equal on all their holders after the sync, this is the
// Σ g² of the (virtual) full model's averaged gradient. At coverage 1 every slice's lowest holder
// is rank 0, and the sum is data parallelism's.
//
// Note [SDP publication]: under backward masking every worker runs the full forward, so it keeps
// a frozen copy of each slice it does not hold (decision 3 of docs/parallel.md). After the
// optimizer step the k holders of a slice hold bitwise the same values (the same averaged
// gradient, the same optimizer state, the same global norm), and one of them sends them to the
// others (SlicePublisher, parallel/sdp/publish.h) over the worker's SDP group (this copy's N
// ranks): every worker receives (1 − C)·Ψ_s elements per step.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/sdp/assignment.h"
#include "parallel/sdp/publish.h"
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
// parameters are recognised by their split over kAxisSdp, their block by their ParamRole,
// core/param_role.h), in ascending id. `held`: the packed runs are the worker's own units (its
// trained parameters), else the units it does not hold (backward masking's frozen copies, listed in
// the same parameter order as the trained ones, so the ids agree). The attention parameters packed
// by forward masking's heads option (is_packed_head_parameter) are left out: they follow the
// heads cover, and head_slices (parallel/sdp/head_slices.h) lists them. Pure: unit-testable
// without communication. Errors name the parameter when a packed run does not cover whole slices.
std::vector<SdpSliceSpec> sdp_slices(const NeuronAssignment& cover, int worker,
                                     const std::vector<std::pair<std::string, Tensor>>& params,
                                     bool held = true);

// Note [SDP setup]: what SdpSync needs of a level and a regime, in terms of workers 0..N−1 of
// one SDP group: the trained parameters' slices (their holders), and under backward masking the
// frozen copies of the slices the worker does not hold, with their slices. The dp group may hold
// R = dp / N replicas of the SDP group (parallel.sdp.workers): dp rank d is worker d mod N of
// replica ⌊d / N⌋, consecutive ranks form a group (Note [SDP replicas]).
struct SdpSetup {
  std::string what;        // e.g. "forward masking, neuron level"
  bool publishes = false;  // backward masking: frozen copies refreshed after each step
  int workers = 1;         // N
  int replication = 1;
  double coverage = 1.0;
  std::vector<SdpSliceSpec> slices;                    // of the trained parameters, ascending id
  std::vector<std::pair<std::string, Tensor>> frozen;  // global name → frozen copy (backward)
  std::vector<SdpSliceSpec> frozen_slices;             // of `frozen`, ascending id
};

// The neuron level: sdp_slices of the trained parameters and of the frozen copies; with the
// heads option's cover, head_slices too, of the frozen copies as well under backward masking
// (Note [SDP slice ids with heads]).
SdpSetup neuron_setup(const NeuronAssignment& cover, int worker,
                      const std::vector<std::pair<std::string, Tensor>>& params,
                      std::vector<std::pair<std::string, Tensor>> frozen = {},
                      bool forward_masking = true, const NeuronAssignment* heads = nullptr);

// One entry of SdpSync::events(): a parameter's grad-ready hook (param = its index) or a slice's
// launch from a hook (id, and its parameter).
struct SdpEvent {
  enum class Kind { kHook, kLaunch };
  Kind kind = Kind::kHook;
  int64_t id = -1;
  size_t param = 0;
};

// Note [SDP replicas]: parallel.sdp.workers = N < dp composes SDP with plain data parallelism:
// the dp group is R = dp / N copies of one SDP group (consecutive ranks), every copy built with
// the same cover, so dp rank d trains worker (d mod N)'s subnetwork on its own batches. A slice's
// gradient is averaged over its k holders in every copy (k·R ranks: one communicator per holder
// set, as without replicas), the replicated parameters over all dp ranks; the norm counts a slice
// on its lowest holder of copy 0, and a checkpoint stores it from there (counts()). Backward
// masking publishes inside each copy (its own group of N ranks).
class SdpSync {
 public:
  // Collective over `dp` (dp.size() a multiple of setup.workers; this rank is worker dp.rank()
  // mod N of copy dp.rank() / N, Note [SDP replicas]). Registers a grad-ready hook on every
  // parameter (inert once this object is gone); micro_batches: the backwards per step
  // (optim.grad_accum), Note [SDP overlapped sync]. With frozen copies (backward masking) the
  // publication's group and staging buffers are made here too (Note [SDP publication]).
  SdpSync(Communicator& dp, SdpSetup setup, std::vector<std::pair<std::string, Tensor>> params,
          SliceSyncOptions options = {}, int micro_batches = 1);
  ~SdpSync();
  SdpSync(const SdpSync&) = delete;
  SdpSync& operator=(const SdpSync&) = delete;

  // Before a step's first backward: the buffers zeroed and attached as .grad, counts and events
  // reset.
  void zero_grad();
  // Note [SDP overlapped sync]: waits for the launched slices (launching the rest); every
  // gradient becomes its holders' average.
  void finish();
  // Note [SDP publication]: after the optimizer step, the frozen copies take the new values of
  // their slices from one holder each. Nothing under forward masking. Collective.
  void publish();
  // The step's events in order (Note [SDP overlapped sync]), cleared by zero_grad().
  const std::vector<SdpEvent>& events() const { return events_; }
  // Whether this rank counts slice `s` in the norm and stores it in a checkpoint: its lowest
  // holder in copy 0 (Notes [SDP global norm], [SDP replicas]).
  bool counts(const SdpSliceSpec& s) const;
  // The backwards of the coming steps (the step runner's micro-batches, given through the
  // engine seam): the last one launches the sync (Note [SDP overlapped sync]).
  void set_micro_batches(int micro_batches);
  int worker() const { return worker_; }
  int replica() const { return replica_; }
  const SdpSetup& setup() const { return setup_; }
  const std::vector<SdpSliceSpec>& slices() const { return setup_.slices; }
  // Backward masking's frozen copies (global name → tensor with its Placement), which a resume
  // reads and publish() refreshes.
  const std::vector<std::pair<std::string, Tensor>>& frozen() const { return setup_.frozen; }
  std::string describe() const;

 private:
  struct HookLink {
    SdpSync* owner = nullptr;
  };
  void on_grad_ready(size_t index, Tensor& leaf);
  void adopt(size_t index);  // .grad into the buffer when it is elsewhere (or zeros if none)
  // A worker list of the setup as dp ranks: the same workers in every copy.
  std::vector<int> dp_ranks(const std::vector<int>& workers) const;

  Communicator& dp_;
  SdpSetup setup_;
  int worker_, replica_;
  std::vector<std::pair<std::string, Tensor>> params_;
  int micro_batches_;
  std::vector<Tensor> buffers_;                  // per parameter: the persistent gradient
  std::vector<std::vector<int64_t>> slice_ids_;  // per parameter: its slices' ids, ascending
  std::vector<int> fired_;                       // per parameter: hooks this step
  std::unique_ptr<SliceSync> sync_;
  std::unique_ptr<Communicator> group_;  // this copy's N ranks (publication), when R > 1
  std::unique_ptr<SlicePublisher> publisher_;
  std::vector<SdpEvent> events_;
  std::shared_ptr<HookLink> link_;  // the hooks reach this object only while it lives
};

}  // namespace loom::parallel::sdp
