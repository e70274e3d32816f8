// train/step_runner.cpp — the plain and the pipelined step runners (see train/step_runner.h).
#include "train/step_runner.h"

#include <algorithm>
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

// This rank's context-parallel part of one batch (the whole batch without cp).
struct LocalBatch {
  Tensor inputs, targets, positions;  // positions undefined: arange (Note [Host ids])
};

LocalBatch local_batch(const Batch& b, const SequenceLayout& layout) {
  return {layout.local_sequence(b.inputs, 1), layout.local_sequence(b.targets, 1),
          layout.local_positions(b.inputs.size(1))};
}

int cp_size(const StepRunnerParts& p) { return p.ctx ? p.ctx->cp_size() : 1; }

// Micro-batch weights of a packed step (Note [Packed loss]): c_m / N, N at least 1.
double packed_weight(const PackedMicroBatch& mb, const PackedStep& step) {
  return static_cast<double>(mb.loss_tokens) /
         static_cast<double>(std::max<int64_t>(step.global_loss_tokens, 1));
}

class PlainRunner final : public StepRunner {
 public:
  explicit PlainRunner(const StepRunnerParts& parts) : p_(parts) {}

  Tensor forward_backward(DataLoader& loader, const DropoutKey& dropout,
                          const optim::LossScaler* scaler) override {
    const int64_t accum = p_.micro_batches;
    // × cp: data parallelism averages over dp·cp ranks (Note [Model-parallel step]).
    return ops::reshape(accumulate(accum, static_cast<double>(cp_size(p_)), dropout, scaler,
                                   [&](int64_t, const DropoutKey* key) {
                                     const Tensor loss =
                                         loss_of(local_batch(loader.next(), *p_.layout), key);
                                     return accum > 1 ? ops::scale(loss, 1.0 / accum) : loss;
                                   }),
                        {1});
  }

  Tensor forward_backward_packed(const PackedStep& step, const DropoutKey& dropout,
                                 const optim::LossScaler* scaler) override {
    // × dp: data parallelism averages over the dp ranks (Note [Packed loss]).
    const double dp = static_cast<double>(p_.data_ranks);
    const Tensor sum = accumulate(
        static_cast<int64_t>(step.micro.size()), dp, dropout, scaler,
        [&](int64_t m, const DropoutKey* key) {
          const PackedMicroBatch& mb = step.micro[static_cast<size_t>(m)];
          return ops::scale(p_.model->loss(mb.inputs, mb.targets, mb.positions, key, mb.doc_start),
                            packed_weight(mb, step));
        });
    return ops::reshape(dp > 1 ? ops::scale(sum, dp) : sum, {1});
  }

  double evaluate_packed(const PackedStep& step) override {
    double loss = 0;
    for (const PackedMicroBatch& mb : step.micro) {
      loss += packed_weight(mb, step) *
              p_.model->loss(mb.inputs, mb.targets, mb.positions, nullptr, mb.doc_start).item();
    }
    return loss;
  }

  double evaluate(DataLoader& loader, int64_t batches) override {
    double mean = 0;
    for (int64_t i = 0; i < batches; ++i)
      mean += loss_of(local_batch(loader.next(), *p_.layout), nullptr).item();
    return mean / static_cast<double>(batches);
  }

  Tensor logits(const Tensor& ids, const Tensor& pos, int64_t) override {
    return p_.model->forward(ids, pos, nullptr);
  }

  int64_t micro_batches() const override { return p_.micro_batches; }
  std::string name() const override { return "plain"; }

 private:
  Tensor loss_of(const LocalBatch& b, const DropoutKey* gen) const {
    if (!b.positions.defined()) return p_.model->loss(b.inputs, b.targets, gen);
    return p_.model->loss(b.inputs, b.targets, b.positions, gen);
  }

  // Micro-batches 0..count-1: loss_m = forward(m, key with micro = m), this rank's weighted
  // share; backward of factor · loss_m (undoing the data-parallel average), the gradient sync
  // armed on the last. Returns Σ_m loss_m, f64 on the device.
  template <typename Forward>
  Tensor accumulate(int64_t count, double factor, const DropoutKey& dropout,
                    const optim::LossScaler* scaler, Forward&& forward) {
    Tensor loss_sum;
    for (int64_t m = 0; m < count; ++m) {
      p_.engine->begin_micro_batch(m, count);  // the last arms the gradient sync
      const auto t_fwd = Clock::now();
      DropoutKey key = dropout;
      key.micro = m;
      const Tensor loss = forward(m, &key);
      const auto t_bwd = Clock::now();
      const Tensor seed = factor != 1.0 ? ops::scale(loss, factor) : loss;
      autograd::backward(scaler ? scaler->scale_loss(seed) : seed);
      if (p_.trace) {
        p_.trace->span("compute", "forward", t_fwd, t_bwd);
        p_.trace->span("compute", "backward", t_bwd, Clock::now());
      }
      const Tensor l = ops::to_dtype(loss.detach(), DType::kF64);
      loss_sum = loss_sum.defined() ? ops::add(loss_sum, l) : l;
    }
    return loss_sum;
  }

  StepRunnerParts p_;
};

class PipelineRunner final : public StepRunner {
 public:
  explicit PipelineRunner(const StepRunnerParts& parts) : p_(parts) {}

  Tensor forward_backward(DataLoader& loader, const DropoutKey& dropout,
                          const optim::LossScaler* scaler) override {
    const auto [inputs, targets] = batches(loader, p_.micro_batches);
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
  double evaluate(DataLoader& loader, int64_t count) override {
    const auto [inputs, targets] = batches(loader, count);
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
  // The next `count` batches as the pipeline takes them: under cp this rank's chunks.
  std::pair<std::vector<Tensor>, std::vector<Tensor>> batches(DataLoader& loader, int64_t count) {
    std::vector<Tensor> inputs, targets;
    for (int64_t i = 0; i < count; ++i) {
      Batch b = loader.next();
      inputs.push_back(p_.layout->local_sequence(b.inputs, 1));
      targets.push_back(p_.layout->local_sequence(b.targets, 1));
    }
    return {std::move(inputs), std::move(targets)};
  }

  StepRunnerParts p_;
};

}  // namespace

Tensor StepRunner::forward_backward_packed(const PackedStep&, const DropoutKey&,
                                           const optim::LossScaler*) {
  LOOM_FAIL("data.packing: the ", name(), " step runner does not take packed steps");
}

double StepRunner::evaluate_packed(const PackedStep&) {
  LOOM_FAIL("data.packing: the ", name(), " step runner does not take packed steps");
}

std::unique_ptr<StepRunner> make_plain_runner(const StepRunnerParts& parts) {
  return std::make_unique<PlainRunner>(parts);
}

std::unique_ptr<StepRunner> make_pipeline_runner(const StepRunnerParts& parts) {
  LOOM_CHECK(parts.pipe != nullptr && parts.ctx != nullptr,
             "make_pipeline_runner: needs a pipeline and a parallel context");
  return std::make_unique<PipelineRunner>(parts);
}

}  // namespace loom
