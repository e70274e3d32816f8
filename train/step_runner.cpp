// train/step_runner.cpp — the plain and the pipelined step runners (see train/step_runner.h).
#include "train/step_runner.h"

#include <chrono>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "train/profiler.h"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;

int cp_size(const StepRunnerParts& p) { return p.ctx ? p.ctx->cp_size() : 1; }

// How a step's micro-batch losses l_m become what this rank backpropagates and returns (Note
// [Model-parallel step], Note [Packed loss]): loss_m = StepData::weight(m) · l_m where `weigh`,
// backward of `backward` · loss_m, and the share `share` · Σ_m loss_m; a factor of 1 is not
// applied.
struct LossRule {
  bool weigh;
  double backward;
  double share;
};

// A packed micro-batch's row padded to a multiple of 2·cp tokens (the load-balanced chunks, Note
// [Causal load balancing] in parallel/cp/ring_attention.h): the padding is a document of its own
// with no loss token (targets -100), so it changes no loss and no other document's attention.
MicroBatch padded_for_cp(const MicroBatch& mb, int cp) {
  const int64_t rows = mb.inputs.size(0), t = mb.inputs.size(1), n = 2 * cp;
  const int64_t pad = (t + n - 1) / n * n - t;
  if (pad == 0) return mb;
  MicroBatch out = mb;
  std::vector<int32_t> pos(static_cast<size_t>(pad)), start(static_cast<size_t>(pad));
  for (int64_t i = 0; i < pad; ++i) {
    pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    start[static_cast<size_t>(i)] = static_cast<int32_t>(t);
  }
  out.inputs = ops::cat({mb.inputs, Tensor::zeros({rows, pad}, mb.inputs.dtype())}, 1);
  out.targets = ops::cat({mb.targets, Tensor::full({rows, pad}, -100, mb.targets.dtype())}, 1);
  out.positions = ops::cat({mb.positions, Tensor::from_vector(pos, {pad})}, 0);
  out.doc_start = ops::cat({mb.doc_start, Tensor::from_vector(start, {pad})}, 0);
  return out;
}

class PlainRunner final : public StepRunner {
 public:
  explicit PlainRunner(const StepRunnerParts& parts) : p_(parts) {}

  Tensor forward_backward(const StepData& step, const DropoutKey& dropout,
                          const optim::LossScaler* scaler) override {
    // (Fewer under a batch ramp: Note [Batch ramp] in train/config.h.)
    LOOM_CHECK(step.loss != StepLoss::kMean ||
                   (step.micro_batches() >= 1 && step.micro_batches() <= p_.micro_batches),
               "plain step runner: a window step of ", step.micro_batches(),
               " micro-batches, expected at most ", p_.micro_batches);
    const LossRule rule = loss_rule(step);
    const Tensor sum = accumulate(step, rule, dropout, scaler);
    return ops::reshape(rule.share != 1.0 ? ops::scale(sum, rule.share) : sum, {1});
  }

  double evaluate(const StepData& step) override {
    double sum = 0;
    for (size_t m = 0; m < step.micro.size(); ++m) {
      const double l = loss_of(step.micro[m], nullptr).item();
      sum += step.loss == StepLoss::kTokens ? step.weight(m) * l : l;
    }
    // Windows: the micro-batches' mean; documents: the weights made the sum the step's loss.
    return step.loss == StepLoss::kMean ? sum / static_cast<double>(step.micro.size()) : sum;
  }

  Tensor logits(const Tensor& ids, const Tensor& pos, int64_t) override {
    return p_.model->forward(ids, pos, nullptr);
  }

  int64_t micro_batches() const override { return p_.micro_batches; }
  std::string name() const override { return "plain"; }

 private:
  LossRule loss_rule(const StepData& step) const {
    if (step.loss == StepLoss::kMean) {  // × cp: data parallelism averages over dp·cp ranks
      return {step.micro_batches() > 1, static_cast<double>(cp_size(p_)), 1.0};
    }
    // × dp·cp for backward: data parallelism averages over dp·cp ranks, whose cp shares of a
    // micro-batch sum to its loss (Note [Packed loss]); × dp for the share (the cp shares are
    // summed, the dp ones averaged).
    const double dp = static_cast<double>(p_.data_ranks);
    return {true, dp * static_cast<double>(cp_size(p_)), dp};
  }

  // A micro-batch's mean loss: packed rows whole, with their positions and document starts;
  // window rows cut to this rank's part by the model's layout (Note [Model-parallel step]).
  Tensor loss_of(const MicroBatch& mb, const DropoutKey* key) const {
    const SequenceLayout& layout = *p_.layout;
    if (mb.doc_start.defined() && cp_size(p_) > 1) {  // Note [Packed loss]: this rank's chunks
      const MicroBatch m = padded_for_cp(mb, cp_size(p_));
      return p_.model->loss(layout.local_sequence(m.inputs, 1), layout.local_sequence(m.targets, 1),
                            layout.local_sequence(m.positions, 0), key, m.doc_start);
    }
    if (mb.doc_start.defined())
      return p_.model->loss(mb.inputs, mb.targets, mb.positions, key, mb.doc_start);
    const Tensor inputs = layout.local_sequence(mb.inputs, 1);
    const Tensor targets = layout.local_sequence(mb.targets, 1);
    const Tensor positions = layout.local_positions(mb.inputs.size(1));  // undefined: arange
    if (!positions.defined()) return p_.model->loss(inputs, targets, key);
    return p_.model->loss(inputs, targets, positions, key);
  }

  // Micro-batches 0..M-1: loss_m = rule applied to the loss with key.micro = m; backward of it
  // (undoing the data-parallel average), the gradient sync armed on the last. Returns Σ_m loss_m,
  // f64 on the device.
  Tensor accumulate(const StepData& step, const LossRule& rule, const DropoutKey& dropout,
                    const optim::LossScaler* scaler) {
    const int64_t count = step.micro_batches();
    Tensor loss_sum;
    first_sq_ = Tensor();
    // Note [Gradient noise scale]: without accumulation the small batch is this rank's whole
    // micro-batch, read by the engine as it hands each gradient bucket to its reduction.
    const bool probe = count == 1 && p_.probe_first_micro_batch;
    probing_ = p_.engine->probe_unreduced_grads(probe) && probe;
    probe_factor_ = rule.weigh ? step.weight(0) * rule.backward : rule.backward;
    for (int64_t m = 0; m < count; ++m) {
      p_.engine->begin_micro_batch(m, count);  // the last arms the gradient sync
      const auto t_fwd = Clock::now();
      DropoutKey key = dropout;
      key.micro = m;
      const auto i = static_cast<size_t>(m);
      Tensor loss = loss_of(step.micro[i], &key);
      if (rule.weigh) loss = ops::scale(loss, step.weight(i));
      const auto t_bwd = Clock::now();
      const Tensor seed = rule.backward != 1.0 ? ops::scale(loss, rule.backward) : loss;
      autograd::backward(scaler ? scaler->scale_loss(seed) : seed);
      if (p_.trace) {
        p_.trace->span("compute", "forward", t_fwd, t_bwd);
        p_.trace->span("compute", "backward", t_bwd, Clock::now());
      }
      if (m == 0 && count > 1 && p_.probe_first_micro_batch) {
        // Note [Gradient noise scale]: before the next micro-batch adds to the buffers; undone
        // the weight and factor its loss was scaled by (the loss scaler's: by the trainer).
        const Tensor sq = p_.engine->local_grad_sum_squares();
        const double k = (rule.weigh ? step.weight(0) : 1.0) * rule.backward;
        if (sq.defined()) first_sq_ = ops::scale(sq, 1.0 / (k * k));
      }
      const Tensor l = ops::to_dtype(loss.detach(), DType::kF64);
      loss_sum = loss_sum.defined() ? ops::add(loss_sum, l) : l;
    }
    return loss_sum;
  }

 public:
  Tensor first_micro_batch_sum_squares() const override {
    if (!probing_) return first_sq_;
    const Tensor sq = p_.engine->local_grad_sum_squares();  // complete once finish() has run
    return sq.defined() ? ops::scale(sq, 1.0 / (probe_factor_ * probe_factor_)) : sq;
  }

 private:
  StepRunnerParts p_;
  Tensor first_sq_;
  bool probing_ = false;
  double probe_factor_ = 1;  // the weight and factor the probed micro-batch's loss was scaled by
};

class PipelineRunner final : public StepRunner {
 public:
  explicit PipelineRunner(const StepRunnerParts& parts) : p_(parts) {}

  Tensor forward_backward(const StepData& step, const DropoutKey& dropout,
                          const optim::LossScaler* scaler) override {
    const auto [inputs, targets] = batches(step);
    LOOM_CHECK(step.micro_batches() == p_.micro_batches, "pipeline step runner: a step of ",
               step.micro_batches(), " micro-batches, the schedule runs ", p_.micro_batches);
    const auto t0 = Clock::now();
    parallel::GradientEngine* engine = p_.engine;
    const int64_t count = p_.micro_batches;
    Tensor loss = ops::reshape(
        p_.pipe->forward_backward(  // the schedule's last backward arms
            inputs, targets, &dropout,
            [engine, count](bool last) { engine->begin_micro_batch(last ? count - 1 : -1, count); },
            scaler ? scaler->device_scale() : Tensor()),
        {1});
    const int cp = cp_size(p_);
    if (cp > 1) {  // the loss carried the ×cp for backward: this rank's share
      loss = ops::div(loss, Tensor::full({1}, static_cast<double>(cp), DType::kF64, loss.device()));
    }
    if (p_.trace) p_.trace->span("compute", "pipeline forward + backward", t0, Clock::now());
    return loss;
  }

  // A forward-only pass through the stages (Note [Pipeline evaluation]).
  double evaluate(const StepData& step) override {
    const auto [inputs, targets] = batches(step);
    return p_.pipe->evaluate(inputs, targets);
  }

  Tensor logits(const Tensor& ids, const Tensor& pos, int64_t rows) override {
    Transformer* model = p_.model;
    return p_.pipe->forward_only(ids, pos, rows,
                                 [model](const Tensor& x) { return model->head_logits(x); });
  }

  int64_t micro_batches() const override { return p_.micro_batches; }
  std::string name() const override { return "pipeline"; }
  std::optional<parallel::pp::PipelineStats> stats() const override {
    return p_.pipe->last_stats();
  }
  void share_head_row(Tensor& row) override {
    p_.ctx->pp().broadcast(row, p_.pipe->last_stage_rank());
  }

 private:
  // The step's micro-batches as the pipeline takes them: under cp this rank's chunks. Windows
  // only: packed documents under pp are refused by the config (train/config.cpp).
  std::pair<std::vector<Tensor>, std::vector<Tensor>> batches(const StepData& step) const {
    LOOM_CHECK(step.loss == StepLoss::kMean,
               "data.packing: the pipeline step runner takes fixed-length windows only");
    std::vector<Tensor> inputs, targets;
    for (const MicroBatch& mb : step.micro) {
      inputs.push_back(p_.layout->local_sequence(mb.inputs, 1));
      targets.push_back(p_.layout->local_sequence(mb.targets, 1));
    }
    return {std::move(inputs), std::move(targets)};
  }

  StepRunnerParts p_;
};

}  // namespace

std::unique_ptr<StepRunner> make_plain_runner(const StepRunnerParts& parts) {
  return std::make_unique<PlainRunner>(parts);
}

std::unique_ptr<StepRunner> make_pipeline_runner(const StepRunnerParts& parts) {
  LOOM_CHECK(parts.pipe != nullptr && parts.ctx != nullptr,
             "make_pipeline_runner: needs a pipeline and a parallel context");
  return std::make_unique<PipelineRunner>(parts);
}

}  // namespace loom
