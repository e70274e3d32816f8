// parallel/pp/pipeline.h — TransformerPipeline: one pp rank's part of a Transformer (its chunks
// of layers, Note [Pipeline partition]) driven by a schedule through the PipelineExecutor,
// plus what the optimiser step needs across stages: the tied-embedding gradient exchange (the
// last stage's copy carries Placement::tied_to, so the global gradient norm of
// parallel/gradients.h leaves it out). It does not own the model, the optimiser or the
// communicators, and it does not reduce over data parallelism (DataParallel on the dp group
// does, on the parameters this class names).
//
// Use, per optimiser step with m micro-batches (the single-process run's grad_accum):
//   zero the gradients; loss = pipe.forward_backward(inputs, targets, &dropout_key);
//   (data parallel: finish the dp gradient sync); pipe.sync_tied_gradients(gradients);
//   sq = global_grad_sq_sum(parameter_grad_pieces(params), &ctx, device); clip; optimiser step
//   over pipe.named_parameters()
//   (or, as the trainer, clip on the device: Note [Device step] in train/train_step.cpp).
//
// Note [Pipeline model memory]: every pp rank builds and initialises the whole Transformer, so
// the initial weights are the single-process run's bit for bit (init draws in parameter
// order), and then trains only the parameters of its own stages. release_other_stages() then
// frees the other stages' weights: each such parameter keeps its shape but is re-pointed at one
// shared zero element (all strides 0) and stops requiring grad, so a rank's resident model is
// its own stages plus the transient full copy at start-up. Those placeholders must never be
// written (a stride-0 write aliases); nothing on this rank reads them.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "core/tensor_piece.h"
#include "layers/transformer.h"
#include "layers/unit_hooks.h"
#include "parallel/comm/communicator.h"
#include "parallel/pp/executor.h"
#include "parallel/pp/schedule.h"

namespace loom::parallel::pp {

struct PipelineOptions {
  ScheduleKind schedule = ScheduleKind::k1F1B;  // parallel.schedule
  int vpp = 1;                                  // parallel.vpp
  int microbatches = 1;                         // m; the loss of each is scaled by 1/m
  std::string layout;                           // parallel.pp_layout ("" = even)
  // parallel.schedule_costs (Note [Schedule costs] in parallel/pp/schedule.h): the costs zb-h1's
  // and zb-v's lists are built at; measured: from the first step's timing, agreed by an
  // all-reduce (max) over cost_group — every rank that runs these lists (tp, cp and dp peers
  // too: their collectives follow the lists); nullptr: the pp group.
  CostSource costs;
  Communicator* cost_group = nullptr;
  // With tensor/context parallelism (train/trainer.cpp, Note [Model-parallel step]): the rows of
  // the activation passed between stages when it is not seq_len (sequence parallelism holds
  // seq_len/tp), the token positions when they are not arange(seq_len) (context parallelism),
  // and a factor on each micro-batch's loss for backward (cp), which the returned loss carries.
  int64_t activation_rows = 0;  // 0: seq_len
  Tensor positions;             // undefined: arange(seq_len)
  double loss_scale = 1.0;
};

// Dropout under the pipeline: each micro-batch's forward carries the step's DropoutKey with its
// micro-batch index, and a block's masks depend on that key, its layer and its activations'
// coordinates alone (Note [Dropout by coordinates] in layers/dropout_key.h), so stages running
// micro-batches in schedule order draw the single process's masks with no offset bookkeeping.

// Note [Sharded stages]: ZeRO-2 shards each bucket's gradient over the data-parallel group and
// ZeRO-3 also its parameters, so the tied embedding can only be synchronised shard by shard
// (Note [Tied embeddings across stages]): the first stage's rank and the last stage's rank of
// the same data-parallel index must own the same elements of wte.weight. Buckets are therefore
// this rank's parameter units in run order, with wte.weight alone in its own unit on both
// stages (the first stage's embeddings unit splits into wte and wpe; the last stage's tied
// copy follows the head): identical buckets shard identically. StageUnitHooks maps the model's
// unit numbers to those buckets for ZeRO-3's gathers. Each unit is gathered for every
// micro-batch's forward and again for its backward, so ZeRO-3 under a pipeline moves 2·m
// gathers per unit and step (m micro-batches) against one for ZeRO-2: the memory/traffic
// trade-off is the user's to choose.
class StageUnitHooks final : public UnitHooks {
 public:
  // inner: the engine whose units are numbered like `buckets` of parameter_units().
  StageUnitHooks(UnitHooks& inner, std::vector<std::vector<int>> buckets)
      : inner_(inner), buckets_(std::move(buckets)) {}
  void before_forward(int unit) override;
  Tensor after_forward(int unit, const Tensor& out) override;

 private:
  const std::vector<int>& of(int unit) const;
  UnitHooks& inner_;
  std::vector<std::vector<int>> buckets_;
};

class TransformerPipeline {
 public:
  // model: the whole model, identical on every rank. pp: this rank's pp group. batch, seq_len:
  // the (B, T) of every micro-batch. Throws ConfigError for an impossible layout or schedule.
  TransformerPipeline(const Transformer& model, Communicator& pp, const PipelineOptions& options,
                      int64_t batch, int64_t seq_len);

  // The parameters this rank trains, in the model's order (with the tied copy of wte.weight
  // on the last stage, Note [Tied embeddings across stages]).
  const std::vector<std::pair<std::string, Tensor>>& named_parameters() const { return params_; }
  // True for the last stage's copy of the tied wte.weight (left out of norms and checkpoints).
  bool is_tied_copy(const std::string& name) const;
  // Frees the weights of the parameters of `model` (the model given to the constructor) that
  // this rank does not train (Note [Pipeline model memory]); returns the elements freed.
  int64_t release_other_stages(Transformer& model) const;

  // Forward and backward of the step's micro-batches (inputs[i], targets[i] of shape (B, T));
  // gradients accumulate into the parameters' .grad. Returns Σ_i loss_i / m, the same on every
  // pp rank (broadcast from the last stage), as a 0-d f64 tensor on the model's device (nothing
  // is read back). before_backward: see ChunkCallbacks. grad_scale (undefined: 1; else a 0-d f64
  // tensor on the model's device holding a power of two, optim::LossScaler::device_scale)
  // multiplies each micro-batch's loss for backward only (dynamic loss scaling).
  Tensor forward_backward(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets,
                          const DropoutKey* dropout,
                          const std::function<void(bool last)>& before_backward = {},
                          const Tensor& grad_scale = Tensor());
  // Validation: a forward-only pass (no autograd graph, no dropout) of each micro-batch
  // (inputs[i], targets[i] of shape (B, T), any count >= 1) through the stages in global stage
  // order (Note [Pipeline evaluation]). Returns the mean of the last stage's losses (unscaled:
  // under cp this rank's share), the same on every pp rank. Collective over the pp group (and
  // whatever the model's forward is collective over: tp, cp).
  double evaluate(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets);
  // The same forward-only walk for one batch of any shape: ids (B', T') at token positions `pos`
  // (T'), activations crossing stages of `rows` rows (T', or the local rows under sp/cp). On the
  // rank of the last stage returns at_last(final activation); elsewhere an undefined tensor.
  // Collective like evaluate(). Used for sampling (Trainer::next_token_logits).
  Tensor forward_only(const Tensor& ids, const Tensor& pos, int64_t rows,
                      const std::function<Tensor(const Tensor& x)>& at_last);
  // The pp rank holding the last stage.
  int last_stage_rank() const { return shape_.stage_rank(shape_.num_global_stages() - 1); }

  // Sharded data parallelism (ZeRO-2/3) under the pipeline, Note [Sharded stages]: this rank's
  // parameters in units, one data-parallel bucket each.
  struct StageUnits {
    std::vector<std::vector<std::pair<std::string, Tensor>>> units;
    // buckets[u]: the units (indices into `units`) that the model's unit u (Note [Parameter
    // units] in layers/transformer.h) maps to; empty for units of other stages.
    std::vector<std::vector<int>> buckets;
  };
  StageUnits parameter_units() const;
  // Exchanges the tied embedding's gradient between the first and the last stage and leaves the
  // sum on both (no-op when untied or pp = 1), once gradients are final: `gradients` are those
  // the optimizer will read (GradientEngine, Note [Engine step] in parallel/engine.h), whole or
  // owned pieces; those of the tied table are exchanged with the other stage's rank of the same
  // data-parallel index, which holds the same ranges (checked on the first call, Note [Sharded
  // stages]), and both keep the sum.
  void sync_tied_gradients(const std::vector<HeldPiece>& gradients);

  const PipelineStats& last_stats() const { return stats_; }
  // The per-stage costs the lists are built at (empty: unit; measured ones after the first step).
  const std::vector<OpCosts>& schedule_costs() const { return costs_; }
  const std::vector<int64_t>& boundaries() const { return boundaries_; }
  std::string describe() const;  // one line: schedule, stages, this rank's blocks

 private:
  bool tied_shared() const;                           // tied embeddings held by two stages
  bool is_tied_table(const std::string& name) const;  // the model's input table (wte)
  // Measured costs: agrees the step's op times over the cost group and rebuilds the lists.
  void adopt_measured_costs();

  const Transformer& model_;
  Communicator& pp_;
  PipelineOptions options_;
  ScheduleShape shape_;
  int64_t batch_, seq_len_;
  std::vector<int64_t> boundaries_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::string table_name_;      // the model's token-embedding table (the tied one when tied)
  std::vector<OpCosts> costs_;  // before executor_: it is built at them
  PipelineExecutor executor_;
  PipelineStats stats_;
  bool tied_ranges_checked_ = false;  // sync_tied_gradients: the ranges verified once
};

}  // namespace loom::parallel::pp
