// train/step_runner.h — StepRunner: how one optimizer step's forward and backward run on this
// rank, the only place the trainer's behaviour depends on the layout: plainly (micro-batch
// accumulation, each micro-batch through the whole local model) or through pipeline stages
// under a schedule. Both read the same batches from the same loader, cut this rank's
// context-parallel chunks of each sequence, scale the loss for accumulation, context
// parallelism and loss scaling the same way, and leave the gradients in the parameters' .grad
// (or the data-parallel buckets) for TrainPlan::finalize_gradients. They also run validation
// and the forward of sampling. Nothing here reduces gradients or steps an optimizer.
//
// Note [Model-parallel step]: under parallel.tp/cp every rank of a data-parallel replica reads
// the same batch; cp rank r keeps its two load-balanced chunks of each sequence with their
// global positions (parallel/cp), as the model's SequenceLayout says (local_sequence,
// local_positions). The model's loss is this rank's share (the cp group's shares
// sum to the replica's mean, Note [Context-parallel loss]); data parallelism averages gradients
// over dp·cp ranks, so the loss is multiplied by cp for backward, which makes that average the
// sum over cp of the replicas' mean. TP ranks hold the same loss.
#pragma once

#include <cstdint>
#include <memory>

#include "core/rng.h"
#include "core/tensor.h"
#include "data/loader.h"
#include "layers/build_context.h"
#include "layers/transformer.h"
#include "optim/loss_scaler.h"
#include "parallel/dp/data_parallel.h"
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
  // The mean validation loss of `batches` batches from `loader` (no graph, no dropout): this
  // rank's share under cp. Collective like a forward.
  virtual double evaluate(DataLoader& loader, int64_t batches) = 0;
  // The logits (1, rows, Vp/tp) of ids (1, T') at positions pos (T'), both this rank's cp part;
  // `rows` the activation rows a stage passes on (T', or the local rows under sp). Undefined on
  // ranks that do not hold the head (pipeline stages before the last).
  virtual Tensor logits(const Tensor& ids, const Tensor& pos, int64_t rows) = 0;
  virtual int64_t micro_batches() const = 0;
  virtual std::string name() const = 0;
  // This step's pipeline schedule statistics (empty for the plain runner).
  virtual parallel::pp::PipelineStats stats() const { return {}; }
};

// What both runners read.
struct StepRunnerParts {
  Transformer* model = nullptr;
  parallel::pp::TransformerPipeline* pipe = nullptr;  // the pipelined runner's
  parallel::DataParallel* dp = nullptr;               // null: no data-parallel engine
  parallel::ParallelContext* ctx = nullptr;           // null: one process
  // Which tokens of each sequence this rank holds (the model's layout: layers/build_context.h).
  std::shared_ptr<const SequenceLayout> layout = single_device_layout();
  int64_t micro_batches = 1;  // optim.grad_accum, or the pipeline's micro-batches
  TraceRecorder* trace = nullptr;
};

std::unique_ptr<StepRunner> make_plain_runner(const StepRunnerParts& parts);
std::unique_ptr<StepRunner> make_pipeline_runner(const StepRunnerParts& parts);

}  // namespace loom
