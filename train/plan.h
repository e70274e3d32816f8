// train/plan.h — the plan builder: from the config and this rank's context it applies the layout
// to the model as a few ordered transforms — tensor/sequence/context parallelism (the layers'
// build context), then pipeline stages, then data parallelism and ZeRO — and hands the trainer
// one TrainPlan: the model, a step runner (plain or pipelined) and a gradient engine (the
// optimizer alone, data parallelism, SDP: parallel/engine.h). The trainer (train/trainer.cpp,
// train_step.cpp, sampling.cpp, checkpointing.cpp) only calls the plan, the runner and the
// engine; it never asks which layout runs. A new scheme is one folder under parallel/ plus one
// transform here (docs/architecture.md walks through ODC, SDP and a DiLoCo outer loop).
//
// Note [Plan order]: tp/sp/cp decide the model's own shape (which parts of each weight a rank
// holds), so they come first; the pipeline then picks this rank's stages of that model; data
// parallelism last re-homes whatever parameters the rank trains into buckets and wraps the
// optimizer around them. Each transform writes the placement of what it splits or replicates
// (Note [Placement] in core/placement.h), which is all the finalisation reads.
#pragma once

#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/build_context.h"
#include "layers/transformer.h"
#include "optim/optimizer.h"
#include "parallel/engine.h"
#include "parallel/pp/pipeline.h"
#include "train/config.h"
#include "train/step_runner.h"

namespace loom {

class TraceRecorder;

// What the caller does between building the model and sharding it (initial weights: the init
// draw, train.init_from) and where the TP layers report their GEMM spans (--profile).
struct PlanHooks {
  std::function<void(Transformer& model)> init;
  TraceRecorder* trace = nullptr;
  std::ostream* log = nullptr;  // for a scheme's own lines (DiLoCo's rounds); null: none
};

struct TrainPlan {
  // The layers' capabilities (layers/build_context.h): the mesh's when tp or cp > 1
  // (parallel/mesh_layers.h), SDP's worker's, else one device's. The model shares them.
  LayerContext layers;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<parallel::pp::TransformerPipeline> pipe;    // pp > 1: the pipelined runner's
  std::unique_ptr<parallel::pp::StageUnitHooks> stage_hooks;  // ZeRO-3 under pp
  // How gradients become final and parameters change (parallel/engine.h): LocalEngine,
  // DataParallel or SdpEngine. The trainer calls nothing else of the scheme.
  std::unique_ptr<parallel::GradientEngine> engine;
  std::unique_ptr<StepRunner> runner;
  parallel::ParallelContext* ctx = nullptr;  // null: one process
  Device device;
  // Which of the data's replicas this rank reads (data-parallel replicas read their own
  // batches; every other rank of a replica reads the same ones).
  int64_t data_rank = 0, data_ranks = 1;
  std::string layout;  // the layout's lines for the start of the log ("" alone)

  // The parameters this rank trains (its stages' under pp; not SDP's frozen ones).
  std::vector<std::pair<std::string, Tensor>> trained() const;
  // Copies of the whole parameters of this rank's model (ZeRO-3 gathers them: collective).
  std::vector<std::pair<std::string, Tensor>> parameters() const;
  // The loss of the global batch from this rank's share of its replica's (StepRunner): summed
  // over cp, averaged over dp; the same on every rank.
  Tensor global_loss(Tensor share) const;
  // Whether a forward involves other ranks (tp/cp collectives, pp stages, ZeRO-3 gathers).
  bool collective_forward() const;
  std::string describe() const;
};

// Note [Plan order]. Throws ConfigError naming the key when the context does not fit the
// config's parallel section. ctx may be null for one process.
TrainPlan build_plan(const Config& cfg, parallel::ParallelContext* ctx, Device device,
                     const PlanHooks& hooks);

// The optim.* optimizer over any parameters: the single process's, or the inner optimizer the
// sharded data-parallel one wraps.
optim::OptimizerFactory optimizer_factory(const OptimConfig& o);

}  // namespace loom
