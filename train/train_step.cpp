// train/train_step.cpp — one training step as the loop runs it: the plan's step runner and
// gradient finalisation, the factor the update applies computed on the device (clipping, loss
// scaling), the read of the step's numbers behind its work, and the step's log line and
// metrics (train/trainer_state.h).
#include <algorithm>
#include <cmath>

#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "optim/clip.h"
#include "train/trainer_state.h"

namespace loom {
namespace {

// The cp layers' waits (Note [Exposed comm]): the cp group's and, under hybrid attention, its
// Ulysses and ring groups' (Note [Hybrid context parallelism] in parallel/cp/hybrid.h).
double cp_waited_s(const parallel::ParallelContext* ctx) {
  if (ctx == nullptr) return 0;
  return ctx->cp().waited_s() + ctx->group({parallel::kAxisCpUlysses}).waited_s() +
         ctx->group({parallel::kAxisCpRing}).waited_s();
}

}  // namespace

// Note [Device step]: a step — one process, or any layout of data, tensor, context and pipeline
// parallelism, any ZeRO stage, with or without loss scaling — never waits for the device. The
// micro-batch losses are summed and the gradients' squares are summed where they lie (data
// parallelism: the loss averaged and Σ g² reduced over the ranks by the communicators, on the
// device too); the factor the update multiplies the gradients by is computed there — the
// clipping factor (clip_scale_tensor), or under dynamic loss scaling the unscale-and-clip factor
// with the scale's update (optim::LossScaler::step_factor, Note [Loss scaling across ranks]) —
// and AdamW's multi-tensor update applies it as it reads the gradients (AdamWOptions::grad_scale),
// skipping an overflowed step on the device with its step count there (AdamWOptions::step_count).
// The numbers the log needs (loss, Σ g², and under loss scaling the scale used and the scaler's
// new state) are copied into pinned host memory behind the step's work (train/readback.h) and
// read when the step is reported: Trainer::run() reports step N after it has launched step
// N + 1, so the host prepares the next step while the device finishes this one. A step after
// which something reads the model (validation, sampling, a checkpoint, the end or a stop) is
// reported at once, so the host's copy of the scaler's state is current whenever a checkpoint
// is written. The step's time is the interval between the moments its numbers and its
// predecessor's reached the host. Batches reach the device by asynchronous uploads, their ids
// checked on the host (Note [Host ids] in layers/transformer.cpp).
PendingStep Trainer::State::train_step() {
  PendingStep pending;
  StepRecord& r = pending.r;
  r.lr = schedule.lr_at(step);
  if (cfg.train.batch_ramp_steps > 0)  // Note [Batch ramp] in train/config.h
    train_data->set_micro_batches(ramp_micro_batches(cfg, step + 1));
  const StepData data = train_data->next_step();
  // Every rank plans the whole step, so all skip alike (Note [Loss tokens and the cut]).
  if (data.global_loss_tokens == 0) return skipped_step(data);
  plan.engine->zero_grad();
  const double tp_waited = ctx ? ctx->tp().waited_s() : 0;  // Note [Exposed comm]
  const double cp_waited = cp_waited_s(ctx);
  const double pp_waited = ctx ? ctx->pp().waited_s() : 0;
  KernelChoices kernel_choices(cfg.train, cudnn_attention);
  // This rank's share of the step's loss: the step runner is the one branch on the layout.
  const DropoutKey dropout{dropout_seed, step, 0};  // the masks of this step's coordinates
  const Tensor share = plan.runner->forward_backward(data, dropout, scaler.get());
  pending.tokens = data.global_tokens;
  pending.rank_tokens = data.rank_tokens;
  pending.rank_micro_batches = data.rank_micro_batches;
  const auto t_sync = Clock::now();
  const Tensor sq_sum = plan.engine->finish();  // Note [Engine step] in parallel/engine.h
  const Tensor loss = plan.global_loss(share);  // the global batch's, on the device
  const auto t_opt = Clock::now();
  finish_step(pending, loss, sq_sum);
  if (trace) {
    trace->span("compute", "wait for gradient sync + norm", t_sync, t_opt);
    trace->span("compute", "clip + optimizer + parameter gather", t_opt, Clock::now());
  }
  r.step = ++step;
  if (const parallel::DpStepStats* st = plan.engine->sync_stats()) pending.dp_stats = *st;
  pending.pipe_stats = plan.runner->stats();
  if (ctx) {
    pending.tp_wait_s = ctx->tp().waited_s() - tp_waited;
    pending.cp_wait_s = cp_waited_s(ctx) - cp_waited;
    pending.pp_wait_s = ctx->pp().waited_s() - pp_waited;
  }
  return pending;
}

// A step whose documents hold no loss token (Note [Loss tokens and the cut] in
// data/packed_loader.h): no forward, backward or update — the weights, the optimizer's moments
// and step count stay as they are — but the step counts (the schedule and the data move on, as
// they would in an uninterrupted run) and is reported with a warning.
PendingStep Trainer::State::skipped_step(const StepData& data) {
  PendingStep pending;
  pending.r.lr = schedule.lr_at(step);
  pending.r.loss = std::nan("");
  pending.r.skipped = true;
  pending.no_loss_tokens = true;
  pending.tokens = data.global_tokens;
  pending.r.step = ++step;
  return pending;
}

// Note [Loss scaling across ranks]: under dynamic loss scaling (train.loss_scaling) every rank
// holds the same Σ g² of the scaled gradients (reduced over the data-parallel shards, the TP
// parts and the pipeline stages before finish_step) and the same scaler state, so every rank's
// device takes the same decision (optim::LossScaler::step_factor): a finite norm gives the
// factor 1/scale (a power of two: exact) times the clipping factor of the unscaled norm; inf/NaN
// gives NaN, which skips the optimizer step on every rank without counting it, and halves the
// scale. One process is the case of one rank. The host learns the outcome when it reports the
// step (the scale used, the new state), as it learns the loss.
void Trainer::State::finish_step(PendingStep& pending, const Tensor& loss, const Tensor& sq_sum) {
  StepRecord& r = pending.r;
  std::vector<Tensor> numbers = {ops::reshape(loss, {1}), ops::reshape(sq_sum, {1})};
  Tensor factor;
  if (scaler) {  // Note [Loss scaling across ranks]
    numbers.push_back(ops::reshape(ops::clone(scaler->device_scale()), {1}));  // before the update
    factor = scaler->step_factor(sq_sum, cfg.optim.grad_clip);
    numbers.push_back(scaler->device_state());
  } else {
    // The clipping factor from the global Σ g², left on the device; none without clipping.
    if (cfg.optim.grad_clip > 0)
      factor = optim::clip_scale_tensor(ops::reshape(sq_sum, {}), cfg.optim.grad_clip);
  }
  if (cfg.train.noise_scale) {  // Note [Gradient noise scale] in train/noise_scale.h
    const Tensor first = plan.runner->first_micro_batch_sum_squares();
    if (first.defined()) {
      pending.noise_index = static_cast<int>(numbers.size());
      numbers.push_back(ops::reshape(ops::to_dtype(first, DType::kF64), {1}));
    }
  }
  pending.numbers = readback.start(ops::cat(numbers, 0));  // Note [Device step]
  plan.engine->step(r.lr, factor);
}

void Trainer::State::report(PendingStep& p, Clock::time_point& since, bool last_launched) {
  if (p.no_loss_tokens) {
    const Clock::time_point now = Clock::now();
    p.r.seconds = std::chrono::duration<double>(now - since).count();
    since = now;
    *log << "step " << p.r.step << "/" << cfg.train.steps
         << " | warning: no loss token in this step's documents within data.seq_len "
         << cfg.data.seq_len << " (cut or masked): step skipped, weights and optimizer unchanged\n";
    log->flush();
    if (metrics) metrics->write(p.r.step, {{"train/lr", p.r.lr}, {"train/skipped", 1.0}});
    return;
  }
  const std::vector<double>& v = p.numbers.get();
  p.r.loss = v[0];
  p.r.grad_norm = std::sqrt(v[1]);
  if (scaler) {  // the norm of the unscaled gradients; an overflow's is left as it is
    p.r.skipped = !std::isfinite(p.r.grad_norm);
    if (!p.r.skipped) p.r.grad_norm /= v[2];
    scaler->mirror({v[3], v[4], v[5]});
  }
  if (p.noise_index >= 0 && !p.r.skipped) {  // both norms of the unscaled gradients
    double small_sq = v[static_cast<size_t>(p.noise_index)];
    if (scaler) small_sq /= v[2] * v[2];
    const double b_small = static_cast<double>(cfg.data.batch_size * cfg.data.seq_len);
    const double b_big = static_cast<double>(p.tokens);
    if (b_big > b_small && std::isfinite(small_sq))
      noise.add(small_sq, p.r.grad_norm * p.r.grad_norm, b_small, b_big);
    p.r.noise_scale = noise.tokens();
  }
  const Clock::time_point ready =
      last_launched ? std::max(p.numbers.ready_at(), Clock::now()) : p.numbers.ready_at();
  p.r.seconds = std::chrono::duration<double>(ready - since).count();
  p.r.comm_blocked_s = p.dp_stats ? p.dp_stats->blocked_s : 0;
  log_step(p, p.r.seconds);
  since = ready;
}

// Note [Exposed comm]: the step line's `comm exposed` is every wait of this rank's compute
// thread on communication in the step, by what it waited for:
//   gradient sync     data parallelism's wait for the gradient reductions after backward
//                     (DpStepStats::exposed_wait_s);
//   parameter gathers ZeRO-3's gathers and ODC's pulls that were not ready when their unit was
//                     needed, and the post-step gathers of ZeRO-1/2 (the rest of
//                     DpStepStats::blocked_s);
//   tp, cp            the tensor- and context-parallel layers' waits on their groups
//                     (Communicator::waited_s; they wait on the compute thread);
//   pipeline sends    the pipeline's wait, at the end of the step, for its sends to complete;
//   tied exchange and loss  the pp group's other waits (Communicator::waited_s less the
//                     executor's): the tied embedding's gradient exchange between the first
//                     and last stages, and the loss broadcast.
// Under imbalance the waits include waiting for slower ranks. A pipeline's waits on receives
// are not in it: they hold the schedule's bubble and the stages' imbalance as well as transfer
// time, and no rank can tell them apart by itself. The pipeline field gives them next to the
// bubble the schedule alone would have at this rank's compute time (PipelineStats), so a wait
// far above that bubble is transfers or imbalance.
namespace {

// The parts of a step's exposed communication (Note [Exposed comm]), those that can occur in
// this layout; `any` when there is communication to speak of.
struct ExposedComm {
  bool any = false;
  double total_s = 0;
  std::vector<std::pair<std::string, double>> parts;
};

// The pp group's waits beyond the executor's: the tied embedding's exchange and the loss
// broadcast.
double pp_other_wait_s(const PendingStep& p) {
  if (!p.pipe_stats) return 0;
  return std::max(0.0, p.pp_wait_s - p.pipe_stats->recv_wait_s - p.pipe_stats->send_wait_s);
}

ExposedComm exposed_comm(const PendingStep& p, bool tp, bool cp) {
  ExposedComm c;
  auto add = [&](const char* what, double s) {
    c.parts.emplace_back(what, s);
    c.total_s += s;
  };
  if (p.dp_stats) {
    add("gradient sync", p.dp_stats->exposed_wait_s);
    const double gathers = p.dp_stats->blocked_s - p.dp_stats->exposed_wait_s;
    if (gathers > 5e-5) add("parameter gathers", gathers);
  }
  if (tp) add("tp", p.tp_wait_s);
  if (cp) add("cp", p.cp_wait_s);
  if (p.pipe_stats) {
    add("pipeline sends", p.pipe_stats->send_wait_s);
    add("tied exchange and loss", pp_other_wait_s(p));
  }
  c.any = !c.parts.empty();
  return c;
}

}  // namespace

void Trainer::State::log_step(const PendingStep& p, double dt) {
  const StepRecord& r = p.r;
  const parallel::DpStepStats dp_stats = p.dp_stats.value_or(parallel::DpStepStats{});
  // Note [Throughput]: tok/s is the whole job's — the tokens of one global batch (every dp
  // replica's micro-batches; a sequence counted once however cp, tp or pp split it) per second
  // of step time — and MFU is those tokens' model FLOPs over the peak of every rank in the job
  // (world size × the per-rank peak). One definition for every layout; with even work it equals
  // each rank's own MFU.
  const double ranks = ctx ? static_cast<double>(ctx->world_size()) : 1.0;
  // A step counts its input tokens (windows: the global batch's sequences × data.seq_len), and
  // their FLOPs at the mean sequence length (for documents a lower bound of the attention
  // FLOPs: Σ s² ≥ (Σ s)² / n).
  const double tokens = static_cast<double>(p.tokens);
  const int64_t flops_len = cfg.data.packing
                                ? std::max<int64_t>(1, p.tokens / global_batch_sequences(cfg))
                                : cfg.data.seq_len;
  const double mfu = model().flops_per_token(flops_len) * tokens / dt / (peak_flops * ranks);
  const AllocatorStats mem = allocator_for(device.type).stats();
  const ExposedComm comm = exposed_comm(p, ctx && ctx->tp_size() > 1, ctx && ctx->cp_size() > 1);
  if (r.step % cfg.train.log_every == 0 || r.step == cfg.train.steps) {
    *log << "step " << r.step << "/" << cfg.train.steps << " | loss " << fmt(r.loss, 4) << " | lr "
         << fmt(r.lr, 2, true) << " | norm " << fmt(r.grad_norm, 3) << " | " << fmt(dt * 1e3, 1)
         << " ms | " << fmt(tokens / dt, 0) << " tok/s | MFU " << fmt(100 * mfu, 1) << "% | peak "
         << fmt(static_cast<double>(mem.peak_bytes) / (1 << 20), 1) << " MiB";
    if (scaler)
      *log << " | loss scale " << scaler->scale() << (r.skipped ? " (overflow: step skipped)" : "");
    if (r.noise_scale) *log << " | noise scale " << fmt(*r.noise_scale, 0) << " tok";
    if (comm.any) {  // every wait of the compute thread on the network (Note [Exposed comm])
      *log << " | comm exposed " << fmt(comm.total_s * 1e3, 1) << " ms";
      if (comm.parts.size() > 1 || comm.parts[0].first != "gradient sync") {
        *log << " (";
        for (size_t i = 0; i < comm.parts.size(); ++i) {
          *log << (i ? ", " : "") << comm.parts[i].first << " "
               << fmt(comm.parts[i].second * 1e3, 1) << " ms";
        }
        *log << ")";
      }
      if (p.dp_stats) {
        *log << ", launched in backward " << fmt(100 * dp_stats.overlap_fraction(), 0) << "%";
      }
    }
    if (p.rank_tokens.size() > 1) {  // the split's balance
      const auto [lo, hi] = std::minmax_element(p.rank_tokens.begin(), p.rank_tokens.end());
      const auto [mlo, mhi] =
          std::minmax_element(p.rank_micro_batches.begin(), p.rank_micro_batches.end());
      *log << " | rank tokens " << *lo << "-" << *hi << ", micro-batches " << *mlo << "-" << *mhi;
    }
    if (p.pipe_stats) {
      const parallel::pp::PipelineStats& ps = *p.pipe_stats;
      *log << " | pipeline idle " << fmt(100 * ps.idle_fraction(), 0) << "% (rank " << ctx->rank()
           << "): receives " << fmt(ps.recv_wait_s * 1e3, 1) << " ms, the schedule's bubble "
           << fmt(ps.schedule_bubble_s() * 1e3, 1) << " ms";
    }
    *log << "\n";
    log->flush();
  }
  if (metrics) {
    metrics->write(r.step, {{"train/loss", r.loss},
                            {"train/lr", r.lr},
                            {"train/grad_norm", r.grad_norm},
                            {"perf/ms_per_step", dt * 1e3},
                            {"perf/tokens_per_s", tokens / dt},
                            {"perf/mfu", mfu},
                            {"mem/peak_bytes", static_cast<double>(mem.peak_bytes)}});
    if (r.noise_scale) {
      metrics->write(r.step, {{"train/noise_scale_tokens", *r.noise_scale},
                              {"train/noise_S", noise.noise()},
                              {"train/noise_G2", noise.signal()}});
    }
    if (scaler)
      metrics->write(r.step, {{"train/loss_scale", scaler->scale()},
                              {"train/skipped", r.skipped ? 1.0 : 0.0}});
    if (comm.any) {
      metrics->write(r.step, {{"comm/exposed_s", comm.total_s},
                              {"comm/grad_sync_wait_s", dp_stats.exposed_wait_s},
                              {"comm/gather_wait_s", dp_stats.blocked_s - dp_stats.exposed_wait_s},
                              {"comm/tp_wait_s", p.tp_wait_s},
                              {"comm/cp_wait_s", p.cp_wait_s},
                              {"comm/pp_send_wait_s", p.pipe_stats ? p.pipe_stats->send_wait_s : 0},
                              {"comm/pp_other_wait_s", pp_other_wait_s(p)}});
    }
    if (p.dp_stats)
      metrics->write(r.step, {{"comm/overlap_fraction", dp_stats.overlap_fraction()}});
    if (p.pipe_stats) {
      metrics->write(r.step, {{"pp/recv_wait_s", p.pipe_stats->recv_wait_s},
                              {"pp/schedule_bubble_s", p.pipe_stats->schedule_bubble_s()}});
    }
  }
}

}  // namespace loom
