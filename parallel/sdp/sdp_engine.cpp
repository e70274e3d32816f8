// parallel/sdp/sdp_engine.cpp — SDP behind the engine seam: the worker's setup, its placements'
// counted slices, the step (see the header, Notes [SDP plan] and [SDP checkpoints]).
#include "parallel/sdp/sdp_engine.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "parallel/gradients.h"
#include "parallel/sdp/backward_masking.h"
#include "parallel/sdp/block_level.h"

namespace loom::parallel::sdp {
namespace {

// What SdpSync needs (Note [SDP setup] in parallel/sdp/sdp_sync.h), once the model is built and
// initialised: at the block level under backward masking the blocks the worker does not hold
// were built frozen (requires_grad false, Note [Block selection] in layers/build_context.h: no
// dW GEMMs, and they are not trained); they are the frozen copies.
SdpSetup setup_of(const SdpOptions& o, const Transformer& model, const NamedTensors& trained,
                  int64_t dp, int worker) {
  const ModelConfig& mc = model.config();
  if (o.blocks()) {
    NamedTensors frozen;
    for (const auto& [name, p] : model.named_parameters())
      if (!p.requires_grad()) frozen.emplace_back(name, p);
    return block_setup(block_cover(o, mc, dp), worker, trained, std::move(frozen), o.forward());
  }
  NamedTensors frozen;
  if (!o.forward()) frozen = frozen_parameters(model);
  const std::optional<NeuronAssignment> heads = heads_cover(o, mc, dp);
  return neuron_setup(neuron_cover(o, mc, dp), worker, trained, std::move(frozen), o.forward(),
                      heads ? &*heads : nullptr);
}

}  // namespace

SdpEngine::SdpEngine(const SdpOptions& o, const Transformer& model, NamedTensors trained,
                     Communicator& dp, optim::OptimizerFactory optimizer, optim::DecayRule rule,
                     SliceSyncOptions sync_options, int micro_batches)
    : dp_(dp), trained_(std::move(trained)) {
  const int worker = static_cast<int>(dp.rank() % workers_of(o, dp.size()));
  SdpSetup setup = setup_of(o, model, trained_, dp.size(), worker);
  optimizer_ = optimizer(optim::make_param_refs(trained_, rule));
  // Its hooks launch each slice's average at the last micro-batch's backward (Note [SDP
  // overlapped sync]); zero_grad attaches its buffers as the gradients.
  sync_ = std::make_unique<SdpSync>(dp, std::move(setup), trained_, std::move(sync_options),
                                    micro_batches);
  mark_counted();
}

void SdpEngine::begin_micro_batch(int64_t m, int64_t count) {
  if (m == 0) sync_->set_micro_batches(static_cast<int>(count));  // the last one launches
}

// Note [SDP checkpoints] in parallel/sdp/sdp_engine.h: each trained parameter's slices, as
// SdpSync lists them, say who counts them (SdpSync::counts: the lowest holder of copy 0). A whole
// slice sets the placement's flag; a packed parameter's split over kAxisSdp is cut at its slices'
// bounds, each run flagged.
void SdpEngine::mark_counted() {
  std::map<size_t, std::vector<const SdpSliceSpec*>> by_param;
  for (const SdpSliceSpec& s : sync_->slices()) by_param[s.param].push_back(&s);
  for (auto& [index, slices] : by_param) {
    Tensor t = trained_[index].second;
    Placement pl = t.placement();
    if (slices.front()->length < 0) {
      pl.counted = sync_->counts(*slices.front());
      t.set_placement(std::move(pl));
      continue;
    }
    PlacementSplit* split = nullptr;
    for (PlacementSplit& s : pl.splits)
      if (s.axis == kAxisSdp) split = &s;
    LOOM_CHECK(split != nullptr && split->dim == slices.front()->dim, "SDP: '",
               trained_[index].first, "' has slices but no split over '", kAxisSdp, "' on dim ",
               slices.front()->dim);
    std::vector<PlacementRun> runs;
    for (const PlacementRun& r : split->runs) {
      for (int64_t at = r.local; at < r.local + r.length;) {
        const SdpSliceSpec* in = nullptr;
        for (const SdpSliceSpec* s : slices)
          if (at >= s->local_begin && at < s->local_begin + s->length) in = s;
        LOOM_CHECK(in != nullptr, "SDP: index ", at, " of '", trained_[index].first,
                   "' is in none of its slices");
        const int64_t end = std::min(r.local + r.length, in->local_begin + in->length);
        runs.push_back({at, r.global + (at - r.local), end - at, sync_->counts(*in)});
        at = end;
      }
    }
    split->runs = std::move(runs);
    t.set_placement(std::move(pl));
  }
}

void SdpEngine::step(double lr, const Tensor& factor) {
  optimizer_->step_scaled(lr, factor);
  sync_->publish();  // backward masking's frozen copies (Note [SDP publication])
}

std::vector<HeldPiece> SdpEngine::trained_pieces() const {
  std::vector<HeldPiece> out;
  for (const auto& [name, p] : trained_) out.push_back(held_whole(name, p));
  return out;
}

std::vector<HeldPiece> SdpEngine::held_parameters() const {
  std::vector<HeldPiece> out = trained_pieces();
  for (const auto& [name, t] : sync_->frozen()) out.push_back(held_whole(name, t));
  return out;
}

std::vector<HeldPiece> SdpEngine::gradients() { return parameter_grad_pieces(trained_); }

double SdpEngine::evaluation_loss(double local) {
  Tensor t = Tensor::full({1}, local, DType::kF64);
  dp_.all_reduce(t, ReduceOp::kAvg);
  return t.item();
}

}  // namespace loom::parallel::sdp
