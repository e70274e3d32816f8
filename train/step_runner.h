// train/step_runner.h — StepRunner: how one optimizer step's forward and backward run on this
// rank: plainly (micro-batch accumulation, each micro-batch through the whole local model) or
// through pipeline stages under a schedule. Both take the step's data as one StepData
// (data/step_data.h: windows or packed documents, from a StepSource), cut this rank's
// context-parallel chunks of each sequence, weight the micro-batches' losses as the step's loss
// says and scale them for context or data parallelism and loss scaling the same way, tell the
// gradient engine where each micro-batch starts (GradientEngine::begin_micro_batch: the one place
// a gradient sync is armed), and leave the gradients in the parameters' .grad (or the engine's
// buffers) for GradientEngine::finish (parallel/engine.h). They also run validation and the
// forward of sampling. Nothing here reads data, reduces gradients or steps an optimizer.
//
// Note [Model-parallel step]: under parallel.tp/cp every rank of a data-parallel replica reads
// the same batch; cp rank r keeps its two load-balanced chunks of each sequence with their
// global positions (parallel/cp), as the model's SequenceLayout says (local_sequence,
// local_positions). The model's loss is this rank's share (the cp group's shares
// sum to the replica's mean, Note [Context-parallel loss]); data parallelism averages gradients
// over dp·cp ranks, so a window step's loss (StepLoss::kMean) is multiplied by cp for backward,
// which makes that average the sum over cp of the replicas' mean. TP ranks hold the same loss.
// A window step of M > 1 micro-batches weighs each micro-batch's mean by 1/M (none for one).
//
// Note [Packed loss]: with data.packing (StepLoss::kTokens) the step's loss is Σ over its loss
// tokens of their cross-entropy / N, N the step's loss tokens on every rank together (the loader
// knows it without communicating). Micro-batch m of rank r returns its mean over its c_m loss
// tokens, so Σ_r Σ_m (c_m / N)·loss_m is the step's loss on any split: ranks may run different
// numbers of micro-batches of different sizes (ODC, or stages 0-2), or padded ones of c = 0
// (ZeRO-3 with collectives). Every micro-batch is weighted by c_m / N (StepData::weight).
// Data parallelism averages gradients over the dp ranks, so each rank backpropagates
// dp·(c_m / N)·loss_m; their average is the gradient of the step's loss. Packing runs without
// tp and pp (refused by the config: train/config.cpp), so its rows are run whole — except under
// cp with Ulysses attention (parallel.cp_attention: ulysses, parallel/cp/ulysses.h): the row is
// padded to a multiple of 2·cp tokens with a document of no loss tokens, each cp rank keeps its
// load-balanced chunks of ids, targets and positions and the whole row's doc_start, its loss is
// its share (Note [Context-parallel loss] in parallel/mesh_layers.cpp), and data parallelism
// averaging over dp·cp ranks, each backpropagates dp·cp·(c_m / N)·share.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "core/rng.h"
#include "core/tensor.h"
#include "data/step_data.h"
#include "layers/build_context.h"
#include "layers/transformer.h"
#include "optim/loss_scaler.h"
#include "parallel/engine.h"
#include "parallel/parallel_context.h"
#include "parallel/pp/pipeline.h"

namespace loom {

class TraceRecorder;

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // One step's micro-batches: forward and backward, gradients accumulated, each micro-batch's
  // mean loss weighted as step.loss says. Returns this rank's share as a (1) f64 tensor on the
  // device, such that TrainPlan::global_loss of the shares is the step's loss: windows, this
  // rank's share of its replica's loss (the micro-batches' mean; under cp this rank's share,
  // Note [Model-parallel step]); documents, dp × this rank's share of the step's loss (Note
  // [Packed loss]). `dropout` carries the step (the runner sets each micro-batch's index: Note
  // [Dropout by coordinates]); `scaler` (null: none) multiplies the loss for backward only.
  virtual Tensor forward_backward(const StepData& step, const DropoutKey& dropout,
                                  const optim::LossScaler* scaler) = 0;
  // The loss of a step evaluated on this rank (no graph, no dropout): windows, the mean of its
  // micro-batches' losses (under cp this rank's share); documents, Σ (c_m / N)·loss_m.
  // Collective like a forward.
  virtual double evaluate(const StepData& step) = 0;
  // The logits (1, rows, Vp/tp) of ids (1, T') at positions pos (T'), both this rank's cp part;
  // `rows` the activation rows a stage passes on (T', or the local rows under sp). Undefined on
  // ranks that do not hold the head (pipeline stages before the last).
  virtual Tensor logits(const Tensor& ids, const Tensor& pos, int64_t rows) = 0;
  // A window step's micro-batches (what the trainer's WindowSource reads per step).
  virtual int64_t micro_batches() const = 0;
  virtual std::string name() const = 0;
  // This step's pipeline schedule statistics (none for the plain runner).
  virtual std::optional<parallel::pp::PipelineStats> stats() const { return std::nullopt; }
  // With StepRunnerParts::probe_first_micro_batch, the last step's first micro-batch's Σ g² of
  // the gradient of its mean loss, on this rank before any reduction (Note [Gradient noise
  // scale] in train/noise_scale.h; without accumulation the engine's probe of its one
  // micro-batch, complete once the engine's finish() has run): a 0-d f64 device tensor;
  // undefined where there is none.
  virtual Tensor first_micro_batch_sum_squares() const { return Tensor(); }
  // Gives every rank the row of logits the ranks holding the head computed (the last stage's,
  // under pp; the plain runner's ranks all hold it). Collective like logits().
  virtual void share_head_row(Tensor& row) { (void)row; }
};

// What both runners read.
struct StepRunnerParts {
  Transformer* model = nullptr;
  parallel::pp::TransformerPipeline* pipe = nullptr;  // the pipelined runner's
  parallel::GradientEngine* engine = nullptr;         // told where each micro-batch starts
  parallel::ParallelContext* ctx = nullptr;           // null: one process
  // Which tokens of each sequence this rank holds (the model's layout: layers/build_context.h).
  std::shared_ptr<const SequenceLayout> layout = single_device_layout();
  int64_t micro_batches = 1;  // optim.grad_accum, or the pipeline's micro-batches
  int64_t data_ranks = 1;     // the ranks the engine averages gradients over (Note [Packed loss])
  TraceRecorder* trace = nullptr;
  bool probe_first_micro_batch = false;  // train.noise_scale
};

std::unique_ptr<StepRunner> make_plain_runner(const StepRunnerParts& parts);
std::unique_ptr<StepRunner> make_pipeline_runner(const StepRunnerParts& parts);

}  // namespace loom
