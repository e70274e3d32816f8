// train/plan.h — the plan builder: from the config and this rank's context it applies the layout
// to the model as a few ordered transforms — tensor/sequence/context parallelism (the layers'
// build context), then pipeline stages, then data parallelism and ZeRO — and hands the trainer
// one TrainPlan: the model, a step runner (plain or pipelined: the one branch on the layout), the
// gradient finalisation and the optimizer. The training loop (train/trainer.cpp) only calls the
// plan; it never asks which layout it runs. A new scheme is one folder under parallel/ plus one
// transform here (docs/architecture.md walks through ODC, SDP and a DiLoCo outer loop).
//
// Note [Plan order]: tp/sp/cp decide the model's own shape (which parts of each weight a rank
// holds), so they come first; the pipeline then picks this rank's stages of that model; data
// parallelism last re-homes whatever parameters the rank trains into buckets and wraps the
// optimizer around them. Each transform writes the placement of what it splits or replicates
// (Note [Placement] in core/placement.h), which is all the finalisation reads.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/build_context.h"
#include "layers/transformer.h"
#include "optim/optimizer.h"
#include "parallel/dp/data_parallel.h"
#include "parallel/pp/pipeline.h"
#include "parallel/sdp/sdp_sync.h"
#include "train/config.h"
#include "train/pieces.h"
#include "train/step_runner.h"

namespace loom {

class TraceRecorder;

// What the caller does between building the model and sharding it (initial weights: the init
// draw, train.init_from) and where the TP layers report their GEMM spans (--profile).
struct PlanHooks {
  std::function<void(Transformer& model)> init;
  TraceRecorder* trace = nullptr;
};

// One tensor the optimizer steps on this rank — a whole parameter, a tensor-parallel part, or a
// ZeRO piece of one — with where it sits in the global parameter (Note [Pieces] in
// train/pieces.h) and whose copy counts (Note [Placement]): what checkpoints write and read.
struct TrainedPiece {
  std::string name;     // the optimizer's name for it: its state is "<kind>.<name>"
  std::string param;    // the global parameter's name
  Tensor values;        // this rank's values (a view)
  TensorPiece piece;    // which elements of the global parameter they are
  Placement placement;  // which ranks hold the same piece
};

struct TrainPlan {
  // The layers' capabilities (layers/build_context.h): the mesh's when tp or cp > 1
  // (parallel/layer_context.h), else one device's. The model shares them.
  LayerContext layers;
  bool model_parallel = false;     // tp or cp > 1
  bool sequence_parallel = false;  // parallel.sequence_parallel, under model_parallel
  std::unique_ptr<Transformer> model;
  std::unique_ptr<parallel::pp::TransformerPipeline> pipe;    // pp > 1
  std::unique_ptr<parallel::DataParallel> dp;                 // dp or cp > 1: owns the optimizer
  std::unique_ptr<parallel::pp::StageUnitHooks> stage_hooks;  // ZeRO-3 under pp
  std::unique_ptr<optim::Optimizer> optimizer;                // without data parallelism
  std::unique_ptr<parallel::sdp::SdpSync> sdp;  // parallel.sdp.mode ≠ none (Note [SDP plan])
  std::unique_ptr<StepRunner> runner;
  parallel::ParallelContext* ctx = nullptr;  // null: one process
  Device device;
  int64_t released = 0;  // parameters of other pipeline stages freed on this rank

  // The parameters this rank trains (its stages' under pp; not SDP's frozen ones).
  std::vector<std::pair<std::string, Tensor>> trained() const;
  // What the optimizer steps on this rank, in the optimizer's order.
  std::vector<TrainedPiece> trained_pieces() const;
  void zero_grad();
  // Note [Gradient finalisation]: the one place a step's gradients become final — the
  // data-parallel sync (the wait for the reductions launched in backward), the tied embedding's
  // exchange between pipeline stages, then the global Σ g² of parallel/gradients.h — returned
  // as a 0-d f64 tensor on the device (nothing read back). Under SDP, SdpSync's holder-group
  // sync and its once-per-element norm instead (Note [SDP plan]).
  Tensor finalize_gradients();
  // The optimizer step with every gradient multiplied by `factor` (0-d f64 on the device,
  // undefined: 1; not finite: the step is skipped, Note [Device step] in train/train_step.cpp).
  void step(double lr, const Tensor& factor);
  // The loss of the global batch from this rank's share of its replica's (StepRunner): summed
  // over cp, averaged over dp; the same on every rank.
  Tensor global_loss(Tensor share) const;
  // Under ZeRO-3 a forward gathers parameters: collective.
  bool zero3() const { return dp && dp->zero_stage() == 3; }
  // Whether a forward involves other ranks (ZeRO-3 gathers, tp/cp collectives, pp stages).
  bool collective_forward() const { return zero3() || model_parallel || pipe; }
  int64_t optimizer_steps() const;
  void set_optimizer_steps(int64_t n);
  std::vector<std::pair<std::string, Tensor>> optimizer_state() const;
  std::string describe() const;  // the layout's lines for the start of the log ("" alone)
};

// Note [SDP plan]: with parallel.sdp.mode forward or backward, dp rank d is worker d mod N of
// an SDP group of N = parallel.sdp.workers ranks (Note [SDP replicas] in parallel/sdp/sdp_sync.h)
// and the model is built with that worker's context: at the neuron level forward masking packs
// the blocks' MLPs to the units it holds (parallel/sdp/packed_layers.h; with parallel.sdp.heads
// also each block's attention to the KV groups of a second cover), backward masking keeps
// the full MLPs (and attention) with the unheld units as a frozen copy; at the block level
// (parallel/sdp/block_level.h) forward masking builds only the held blocks, backward masking
// builds all with the unheld ones frozen (requires_grad false: trained() leaves them out).
// There is no DataParallel; the optim.* optimizer runs over trained(), so optimizer state exists
// only for the held slices and the replicated parameters. SdpSync finalises the gradients: each
// slice averaged over its holders (in every data-parallel copy), the replicated parameters over the
// dp group, launched from the gradient hooks during the step's last backward (Note [SDP
// overlapped sync]), so finalize_gradients only waits; the global norm counts each element once;
// after the optimizer step, step() has it publish the held slices to the frozen copies (Note
// [SDP publication]). The data are the dp rank's, as under data parallelism; checkpoints store
// each slice once (Note [SDP checkpoints] in train/train_state.cpp).

// Note [Plan order]. Throws ConfigError naming the key when the context does not fit the
// config's parallel section. ctx may be null for one process.
TrainPlan build_plan(const Config& cfg, parallel::ParallelContext* ctx, Device device,
                     const PlanHooks& hooks);

// The optim.* optimizer over any parameters: the single process's, or the inner optimizer the
// sharded data-parallel one wraps.
optim::OptimizerFactory optimizer_factory(const OptimConfig& o);

}  // namespace loom
