// train/step_runner.h — StepRunner: how one optimizer step's forward and backward run on this
// rank: plainly (micro-batch accumulation, each micro-batch through the whole local model) or
// through pipeline stages under a schedule. Both read the same batches from the same loader, cut
// this rank's context-parallel chunks of each sequence, scale the loss for accumulation, context
// parallelism and loss scaling the same way, tell the gradient engine where each micro-batch
// starts (GradientEngine::begin_micro_batch: the one place a gradient sync is armed), and leave
// the gradients in the parameters' .grad (or the engine's buffers) for GradientEngine::finish
// (parallel/engine.h). They also run validation and the forward of sampling. Nothing here
// reduces gradients or steps an optimizer.
//
// Note [Model-parallel step]: under parallel.tp/cp every rank of a data-parallel replica reads
// the same batch; cp rank r keeps its two load-balanced chunks of each sequence with their
// global positions (parallel/cp), as the model's SequenceLayout says (local_sequence,
// local_positions). The model's loss is this rank's share (the cp group's shares
// sum to the replica's mean, Note [Context-parallel loss]); data parallelism averages gradients
// over dp·cp ranks, so the loss is multiplied by cp for backward, which makes that average the
// sum over cp of the replicas' mean. TP ranks hold the same loss.
//
// Note [Packed loss]: with data.packing the step's loss is Σ over its loss tokens of their
// cross-entropy / N, N the step's loss tokens on every rank together (the loader knows it without
// communicating). Micro-batch m of rank r returns its mean over its c_m loss tokens, so
// Σ_r Σ_m (c_m / N)·loss_m is the step's loss on any split: ranks may run different numbers of
// micro-batches of different sizes (ODC, or stages 0-2), or padded ones of c = 0 (ZeRO-3 with
// collectives). Data parallelism averages gradients over the dp ranks, so each rank backpropagates
// dp·(c_m / N)·loss_m; their average is the gradient of the step's loss.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "core/rng.h"
#include "core/tensor.h"
#include "data/loader.h"
#include "data/packed_loader.h"
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
  // The step's micro-batches from `loader`: forward and backward, gradients accumulated. Returns
  // this rank's share of its replica's loss (the micro-batches' mean; under cp this rank's
  // share, Note [Model-parallel step]) as a (1) f64 tensor on the device. `dropout` carries
  // the step (the runner sets each micro-batch's index: Note [Dropout by coordinates]);
  // `scaler` (null: none) multiplies the loss for backward only.
  virtual Tensor forward_backward(DataLoader& loader, const DropoutKey& dropout,
                                  const optim::LossScaler* scaler) = 0;
  // A packed step (data.packing, Note [Packed steps] in data/packed_loader.h): this rank's
  // micro-batches, micro-batch m's mean loss weighted by c_m / N (c_m its loss tokens, N the
  // step's over every rank) and by the data-parallel size for backward, which data parallelism
  // averages (Note [Packed loss]). Returns dp × this rank's share of the step's loss, so that
  // the data-parallel average (TrainPlan::global_loss) is the step's loss.
  virtual Tensor forward_backward_packed(const PackedStep& step, const DropoutKey& dropout,
                                         const optim::LossScaler* scaler);
  // The loss of a whole packed step evaluated on this rank (no graph, no dropout): Σ c_m·loss_m
  // / N. Collective like a forward.
  virtual double evaluate_packed(const PackedStep& step);
  // The mean validation loss of `batches` batches from `loader` (no graph, no dropout): this
  // rank's share under cp. Collective like a forward.
  virtual double evaluate(DataLoader& loader, int64_t batches) = 0;
  // The logits (1, rows, Vp/tp) of ids (1, T') at positions pos (T'), both this rank's cp part;
  // `rows` the activation rows a stage passes on (T', or the local rows under sp). Undefined on
  // ranks that do not hold the head (pipeline stages before the last).
  virtual Tensor logits(const Tensor& ids, const Tensor& pos, int64_t rows) = 0;
  virtual int64_t micro_batches() const = 0;
  virtual std::string name() const = 0;
  // This step's pipeline schedule statistics (none for the plain runner).
  virtual std::optional<parallel::pp::PipelineStats> stats() const { return std::nullopt; }
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
};

std::unique_ptr<StepRunner> make_plain_runner(const StepRunnerParts& parts);
std::unique_ptr<StepRunner> make_pipeline_runner(const StepRunnerParts& parts);

}  // namespace loom
