// parallel/sdp/sdp_engine.h — SdpEngine: SDP (subnetwork data parallelism, docs/parallel.md,
// "SDP") behind the engine seam (parallel/engine.h). It owns the worker's SdpSync (the gradient
// sync over holder sets, overlapped with backward; the publication to frozen copies) and the
// optim.* optimizer over the worker's trained parameters, and it writes into their placements
// which holder counts each slice (Note [Holders that no axis names] in core/placement.h), so the
// global norm and the checkpoint writer need no SDP rule.
//
// Note [SDP plan]: with parallel.sdp.mode forward or backward, dp rank d is worker d mod N of
// an SDP group of N = parallel.sdp.workers ranks (Note [SDP replicas] in parallel/sdp/sdp_sync.h)
// and the model is built with that worker's layers (worker_layers, parallel/sdp/options.h): at
// the neuron level forward masking packs the blocks' MLPs to the units it holds
// (parallel/sdp/forward_masking.h; with parallel.sdp.heads also each block's attention to the KV
// groups of a second cover), backward masking keeps the full MLPs (and attention) with the unheld
// units as a frozen copy (parallel/sdp/backward_masking.h); at the block level
// (parallel/sdp/block_level.h) forward masking builds only the held blocks, backward masking
// builds all with the unheld ones frozen (requires_grad false: not trained). There is no
// DataParallel; the optimizer runs over the trained parameters, so optimizer state exists only
// for the held slices and the replicated parameters. SdpSync finalises the gradients: each slice
// averaged over its holders (in every data-parallel copy), the replicated parameters over the dp
// group, launched from the gradient hooks during the step's last backward (Note [SDP overlapped
// sync] in parallel/sdp/sdp_sync.h). After the optimizer step the held slices are published to
// the frozen copies (Note [SDP publication] in parallel/sdp/sdp_sync.h).
//
// Note [SDP checkpoints]: an SDP run's checkpoint is an ordinary one: every element of every
// global tensor stored exactly once, so any layout resumes it — the same SDP run, another cover,
// or one process (its consolidation into the full model; `convert` then writes Hugging Face
// files). Each slice is counted (in the norm) and stored (in a checkpoint) by its lowest holder
// of data-parallel copy 0, the replicated parameters by dp rank 0: the engine re-cuts each packed
// parameter's runs at its slices and marks the others' runs as counted elsewhere, so the writer
// stores one piece per rank whose runs are the slices that rank counts (parallel/gradients.h,
// counted_part), and its optimizer state the same piece of the state. A resume reads each rank's
// own packed pieces, and under backward masking its frozen copies, from whichever files hold them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/transformer.h"
#include "optim/decay_rule.h"
#include "optim/optimizer.h"
#include "parallel/engine.h"
#include "parallel/sdp/options.h"
#include "parallel/sdp/sdp_sync.h"

namespace loom::parallel::sdp {

class SdpEngine final : public GradientEngine {
 public:
  // `model` was built with worker_layers(o, model config, dp.size(), dp.rank() mod N) and
  // initialised; `trained` its trained parameters (requires_grad), in order. Collective over
  // `dp` (the whole world: SDP runs over parallel.dp alone).
  SdpEngine(const SdpOptions& o, const Transformer& model, NamedTensors trained, Communicator& dp,
            optim::OptimizerFactory optimizer, optim::DecayRule rule, SliceSyncOptions sync_options,
            int micro_batches);

  void zero_grad() override { sync_->zero_grad(); }
  void begin_micro_batch(int64_t m, int64_t count) override;
  void step(double lr, const Tensor& factor) override;
  std::vector<HeldPiece> trained_pieces() const override;
  std::vector<HeldPiece> held_parameters() const override;  // with the frozen copies
  NamedTensors optimizer_state() override { return optimizer_->state_tensors(); }
  int64_t optimizer_steps() const override { return optimizer_->step_count(); }
  void set_optimizer_steps(int64_t n) override { optimizer_->set_step_count(n); }
  // Each worker evaluated its own subnetwork: their mean over the dp group.
  double evaluation_loss(double local) override;
  std::string describe() const override { return sync_->describe(); }
  const SdpSync& slice_sync() const { return *sync_; }

 protected:
  void sync() override { sync_->finish(); }
  std::vector<HeldPiece> gradients() override;

 private:
  void mark_counted();  // Note [SDP checkpoints]

  Communicator& dp_;
  NamedTensors trained_;
  std::unique_ptr<SdpSync> sync_;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace loom::parallel::sdp
