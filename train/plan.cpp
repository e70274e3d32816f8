// train/plan.cpp — the plan builder (Note [Plan order] in train/plan.h) and the few operations
// the trainer runs through the plan: gradient finalisation, the optimizer step, the loss
// reductions, the optimizer state.
#include "train/plan.h"

#include <optional>
#include <sstream>

#include "core/ops/view.h"
#include "optim/adamw.h"
#include "optim/decay_rule.h"
#include "optim/sgd.h"
#include "parallel/gradients.h"
#include "parallel/layer_context.h"
#include "parallel/sdp/block_level.h"
#include "parallel/sdp/packed_layers.h"
#include "train/profiler.h"

namespace loom {
namespace {

// The covers of parallel.sdp (Note [SDP plan]): every block's MLP hidden units, or the blocks,
// over the N workers of an SDP group.
parallel::sdp::CoverOptions sdp_cover_options(const Config& cfg) {
  parallel::sdp::CoverOptions o;
  o.workers = static_cast<int>(sdp_workers(cfg));
  o.coverage = cfg.parallel.sdp.coverage;
  o.seed = static_cast<uint64_t>(cfg.parallel.sdp.seed);
  return o;
}
parallel::sdp::NeuronAssignment neuron_cover(const Config& cfg) {
  return parallel::sdp::assign_neurons(
      sdp_cover_options(cfg),
      std::vector<int64_t>(static_cast<size_t>(cfg.model.n_layer), cfg.model.ffn_hidden_size()));
}
// The heads option's cover of each block's KV groups, drawn with seed + 1 so that it differs
// from the MLP's.
std::optional<parallel::sdp::NeuronAssignment> heads_cover(const Config& cfg) {
  if (!cfg.parallel.sdp.heads) return std::nullopt;
  parallel::sdp::CoverOptions o = sdp_cover_options(cfg);
  o.seed += 1;
  return parallel::sdp::assign_neurons(
      o, std::vector<int64_t>(static_cast<size_t>(cfg.model.n_layer), cfg.model.kv_heads()),
      "model.n_kv_head");
}
parallel::sdp::BlockAssignment block_cover(const Config& cfg) {
  return parallel::sdp::assign_blocks(sdp_cover_options(cfg), cfg.model.n_layer);
}
bool sdp_blocks(const Config& cfg) { return cfg.parallel.sdp.level == "block"; }
bool sdp_forward(const Config& cfg) { return cfg.parallel.sdp.mode == "forward"; }

// The layers of SDP worker `worker` (Note [SDP plan]).
LayerContext sdp_layer_context(const Config& cfg, int worker) {
  if (sdp_blocks(cfg))
    return parallel::sdp::block_masking_context(block_cover(cfg), worker, sdp_forward(cfg));
  return sdp_forward(cfg)
             ? parallel::sdp::forward_masking_context(neuron_cover(cfg), worker, heads_cover(cfg))
             : parallel::sdp::backward_masking_context(neuron_cover(cfg), worker, heads_cover(cfg));
}

// What SdpSync needs (Note [SDP setup] in parallel/sdp/sdp_sync.h), once the model is built and
// initialised: at the block level under backward masking the blocks the worker does not hold
// were built frozen by its context (requires_grad false, Note [Block selection]: no dW GEMMs,
// and TrainPlan::trained leaves them out); they are the frozen copies.
parallel::sdp::SdpSetup sdp_setup(TrainPlan& plan, const Config& cfg, int worker) {
  const std::vector<std::pair<std::string, Tensor>> all = plan.model->named_parameters();
  if (sdp_blocks(cfg)) {
    const parallel::sdp::BlockAssignment cover = block_cover(cfg);
    std::vector<std::pair<std::string, Tensor>> frozen;
    for (const auto& [name, p] : all)
      if (!p.requires_grad()) frozen.emplace_back(name, p);
    return parallel::sdp::block_setup(cover, worker, plan.trained(), std::move(frozen),
                                      sdp_forward(cfg));
  }
  std::vector<std::pair<std::string, Tensor>> frozen;
  if (!sdp_forward(cfg)) {
    auto f =
        std::dynamic_pointer_cast<const parallel::sdp::BackwardMaskingLinear>(plan.layers.linear);
    LOOM_CHECK(f != nullptr, "SDP: backward masking's model was not built with its factory");
    frozen = parallel::sdp::frozen_parameters(*f, all);
  }
  const std::optional<parallel::sdp::NeuronAssignment> heads = heads_cover(cfg);
  return parallel::sdp::neuron_setup(neuron_cover(cfg), worker, plan.trained(), std::move(frozen),
                                     sdp_forward(cfg), heads ? &*heads : nullptr);
}

// 1. Tensor, sequence and context parallelism: the model's layers built with the mesh's
// capabilities over the tp and cp groups (parallel/layer_context.h); the TP layers place their
// parts, every other parameter is whole on each TP rank.
void apply_model_parallel(TrainPlan& plan, const Config& cfg, const PlanHooks& hooks) {
  parallel::ParallelContext* ctx = plan.ctx;
  if (cfg.parallel.tp > 1 || cfg.parallel.cp > 1) {
    LOOM_CONFIG_CHECK(
        ctx != nullptr && ctx->tp_size() == cfg.parallel.tp && ctx->cp_size() == cfg.parallel.cp,
        "parallel.tp: ", cfg.parallel.tp, " × parallel.cp ", cfg.parallel.cp,
        " need a parallel context with those sizes (mpirun -np dp·pp·cp·tp)");
    parallel::tp::SpanSink spans;
    if (hooks.trace) {  // the TP layers' GEMMs beside the communicators' events (--profile)
      spans = [t = hooks.trace](const std::string& what, std::chrono::steady_clock::time_point b,
                                std::chrono::steady_clock::time_point e) {
        t->span("compute", what, b, e);
      };
    }
    plan.layers = parallel::mesh_layer_context(ctx->tp(), ctx->cp(), cfg.parallel.sequence_parallel,
                                               std::move(spans));
    plan.model_parallel = true;
    plan.sequence_parallel = cfg.parallel.sequence_parallel;
  }
  if (cfg.parallel.sdp.mode != "none") {  // Note [SDP plan]
    LOOM_CONFIG_CHECK(
        ctx != nullptr && ctx->dp_size() == cfg.parallel.dp && ctx->world_size() == cfg.parallel.dp,
        "parallel.sdp.mode: SDP over parallel.dp ", cfg.parallel.dp,
        " ranks needs a parallel context of that many dp ranks (mpirun -np ", cfg.parallel.dp, ")");
    plan.layers = sdp_layer_context(cfg, static_cast<int>(ctx->dp_rank() % sdp_workers(cfg)));
  }
  // Parameters are built on the device (drawn on the host, so every device starts from the
  // same values); with train.precision ≠ train.dtype the forward casts them (Note [Precision]).
  plan.model = std::make_unique<Transformer>(cfg.model, train_dtype(cfg.train.dtype), plan.device,
                                             plan.layers);
  if (plan.model_parallel) parallel::mark_replicated(plan.model->parameters(), parallel::kAxisTp);
  if (cfg.train.precision != cfg.train.dtype)
    plan.model->set_compute_dtype(train_dtype(cfg.train.precision));
}

// 2. Pipeline stages: this rank's chunks of layers; the other stages' weights are released.
void apply_pipeline(TrainPlan& plan, const Config& cfg) {
  if (cfg.parallel.pp == 1) return;
  parallel::ParallelContext* ctx = plan.ctx;
  LOOM_CONFIG_CHECK(
      ctx != nullptr && ctx->pp_size() == cfg.parallel.pp, "parallel.pp: ", cfg.parallel.pp,
      " stages need a parallel context with pp = ", cfg.parallel.pp, " (mpirun -np dp·pp)");
  parallel::pp::PipelineOptions po;
  po.schedule = parallel::pp::parse_schedule(cfg.parallel.schedule);
  po.vpp = static_cast<int>(cfg.parallel.vpp);
  po.microbatches = static_cast<int>(pipeline_microbatches(cfg));
  po.layout = cfg.parallel.pp_layout;
  // Each micro-batch is this rank's tokens of the sequences, as the layout says (Note
  // [Model-parallel step]); the stages pass on the activation rows it holds of them.
  const SequenceLayout& layout = *plan.layers.layout;
  const Tensor positions = layout.local_positions(cfg.data.seq_len);  // undefined: arange(T)
  const int64_t local_seq = positions.defined() ? positions.size(0) : cfg.data.seq_len;
  if (positions.defined()) {
    po.positions = positions.to(plan.device);
    po.activation_rows = layout.row_positions(positions).size(0);
  }
  po.loss_scale = static_cast<double>(ctx->cp_size());  // × cp: Note [Model-parallel step]
  plan.pipe = std::make_unique<parallel::pp::TransformerPipeline>(*plan.model, ctx->pp(), po,
                                                                  cfg.data.batch_size, local_seq);
  plan.released = plan.pipe->release_other_stages(*plan.model);
}

// 3. Data parallelism and ZeRO over {dp, cp} (under context parallelism each cp rank holds part
// of the same samples' gradients, Note [Model-parallel step]), wrapping the optim.* optimizer;
// or, alone, that optimizer over the trained parameters.
void apply_data_parallel(TrainPlan& plan, const Config& cfg) {
  const ParallelConfig& pc = cfg.parallel;
  const optim::DecayRule rule = optim::parse_decay_rule(cfg.optim.decay_rule);
  if (pc.sdp.mode != "none") {  // Note [SDP plan]
    parallel::ParallelContext* ctx = plan.ctx;
    parallel::sdp::SdpSetup setup =
        sdp_setup(plan, cfg, static_cast<int>(ctx->dp_rank() % sdp_workers(cfg)));
    plan.optimizer = optimizer_factory(cfg.optim)(optim::make_param_refs(plan.trained(), rule));
    plan.model->set_batch_slice(
        {ctx->dp_rank() * cfg.data.batch_size, pc.dp * cfg.data.batch_size});
    parallel::sdp::SliceSyncOptions so;
    so.bucket_bytes = static_cast<size_t>(pc.bucket_mb * (1 << 20));
    so.timeout_s = pc.comm_timeout_s;
    // Its hooks launch each slice's average at the last micro-batch's backward (Note [SDP
    // overlapped sync]); zero_grad attaches its buffers as the gradients.
    plan.sdp = std::make_unique<parallel::sdp::SdpSync>(ctx->dp(), std::move(setup), plan.trained(),
                                                        std::move(so),
                                                        static_cast<int>(cfg.optim.grad_accum));
    return;
  }
  if (pc.dp == 1 && pc.cp == 1) {
    plan.optimizer = optimizer_factory(cfg.optim)(optim::make_param_refs(plan.trained(), rule));
    return;
  }
  parallel::ParallelContext* ctx = plan.ctx;
  const int world = ctx ? ctx->world_size() : 1;
  const int64_t ranks = pc.dp * pc.pp * pc.cp * pc.tp;
  if (world != ranks) {
    throw ConfigError("parallel.dp: " + std::to_string(pc.dp) + " × pp " + std::to_string(pc.pp) +
                      " × cp " + std::to_string(pc.cp) + " × tp " + std::to_string(pc.tp) +
                      " does not match the world size " + std::to_string(world) +
                      " (start with mpirun -np " + std::to_string(ranks) + ")");
  }
  if (pc.dp > 1) {  // dropout draws the single-process batch's masks for this replica's rows
    plan.model->set_batch_slice(
        {ctx->dp_rank() * cfg.data.batch_size, pc.dp * cfg.data.batch_size});
  }
  parallel::DataParallelConfig c;
  c.zero_stage = static_cast<int>(pc.zero_stage);
  c.bucket_bytes = static_cast<size_t>(pc.bucket_mb * (1 << 20));
  c.overlap = pc.overlap;
  c.table_shortcuts = pc.table_shortcuts;
  c.odc = pc.odc;  // Note [ODC] in parallel/odc/odc_gatherer.h
  c.odc_deterministic = pc.odc_deterministic;
  c.odc_timeout_s = pc.comm_timeout_s;
  c.optimizer = optimizer_factory(cfg.optim);
  c.decay_rule = rule;
  c.axes = {parallel::kAxisDp, parallel::kAxisCp};
  parallel::MicsGroups mics;
  if (pc.mics_partition_size > 0) {
    mics = {&ctx->group({parallel::kAxisMicsPartition}), &ctx->group({parallel::kAxisMicsReplica})};
  }
  parallel::Communicator& group = ctx->group(c.axes);
  if (plan.pipe && c.zero_stage >= 2) {  // this stage's units (Note [Sharded stages])
    parallel::pp::TransformerPipeline::StageUnits units = plan.pipe->parameter_units();
    plan.dp = std::make_unique<parallel::DataParallel>(units.units, group, c, mics);
    if (c.zero_stage == 3) {
      plan.stage_hooks = std::make_unique<parallel::pp::StageUnitHooks>(*plan.dp->unit_hooks(),
                                                                        std::move(units.buckets));
      plan.model->set_unit_hooks(plan.stage_hooks.get());
    }
  } else if (c.zero_stage == 3) {  // parameters gathered per unit (Note [ZeRO-3])
    plan.dp =
        std::make_unique<parallel::DataParallel>(plan.model->parameter_units(), group, c, mics);
    plan.model->set_unit_hooks(plan.dp->unit_hooks());
  } else {
    std::vector<std::pair<std::string, Tensor>> named;
    for (const optim::ParamRef& r : optim::make_param_refs(plan.trained(), rule))
      named.emplace_back(r.name, r.param);
    plan.dp = std::make_unique<parallel::DataParallel>(named, group, c, mics);
  }
}

}  // namespace

optim::OptimizerFactory optimizer_factory(const OptimConfig& o) {
  if (o.name == "sgd") {
    return [o](std::vector<optim::ParamRef> refs) -> std::unique_ptr<optim::Optimizer> {
      return std::make_unique<optim::SGD>(std::move(refs), o.momentum, o.weight_decay);
    };
  }
  return [o](std::vector<optim::ParamRef> refs) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(std::move(refs), o.beta1, o.beta2, o.eps, o.weight_decay);
  };
}

TrainPlan build_plan(const Config& cfg, parallel::ParallelContext* ctx, Device device,
                     const PlanHooks& hooks) {
  TrainPlan plan;
  plan.ctx = ctx;
  plan.device = device;
  apply_model_parallel(plan, cfg, hooks);
  if (hooks.init) hooks.init(*plan.model);
  apply_pipeline(plan, cfg);
  apply_data_parallel(plan, cfg);
  StepRunnerParts parts;
  parts.model = plan.model.get();
  parts.pipe = plan.pipe.get();
  parts.dp = plan.dp.get();
  parts.ctx = ctx;
  parts.layout = plan.layers.layout;
  parts.trace = hooks.trace;
  parts.micro_batches = plan.pipe ? pipeline_microbatches(cfg) : cfg.optim.grad_accum;
  plan.runner = plan.pipe ? make_pipeline_runner(parts) : make_plain_runner(parts);
  return plan;
}

std::vector<std::pair<std::string, Tensor>> TrainPlan::trained() const {
  if (pipe) return pipe->named_parameters();
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, p] : model->named_parameters())  // less frozen ones (Note [SDP plan])
    if (p.requires_grad()) out.emplace_back(name, p);
  return out;
}

std::vector<TrainedPiece> TrainPlan::trained_pieces() const {
  std::vector<TrainedPiece> out;
  if (!dp) {
    for (const auto& [name, p] : trained())
      out.push_back({name, name, p, piece_of(p.placement(), p.shape()), p.placement()});
    return out;
  }
  for (parallel::DataParallel::OwnedPiece& o : dp->owned_pieces()) {
    TensorPiece piece = piece_of(o.parameter.placement(), o.parameter.shape(), o.begin, o.end);
    out.push_back({std::move(o.name), std::move(o.param), std::move(o.values), std::move(piece),
                   std::move(o.placement)});
  }
  return out;
}

void TrainPlan::zero_grad() {
  if (sdp)  // Note [SDP plan]: the persistent buffers become the gradients
    sdp->zero_grad();
  else if (dp)
    dp->zero_grad();
  else
    optimizer->zero_grad();
}

Tensor TrainPlan::finalize_gradients() {
  if (sdp) {  // Note [SDP plan]
    sdp->finish();
    return sdp->grad_sq_sum(device);
  }
  if (dp) dp->finish_gradient_sync();
  if (pipe) {  // Note [Tied embeddings across stages]; shard by shard when sharded
    if (dp && dp->zero_stage() >= 2)
      pipe->sync_tied_gradient_pieces(dp->owned_grad_pieces());
    else
      pipe->sync_tied_gradients();
  }
  if (dp) return parallel::global_grad_sq_sum(dp->grad_pieces(), ctx, device);
  std::vector<Tensor> params;
  for (const auto& [name, p] : trained()) params.push_back(p);
  return parallel::global_grad_sq_sum(parallel::parameter_grad_pieces(params), ctx, device);
}

void TrainPlan::step(double lr, const Tensor& factor) {
  if (dp)
    dp->step_scaled(lr, factor);
  else
    optimizer->step_scaled(lr, factor);
  if (sdp) sdp->publish();  // backward masking's frozen copies (Note [SDP publication])
}

Tensor TrainPlan::global_loss(Tensor share) const {
  if (ctx == nullptr) return share;
  if (ctx->cp_size() > 1) ctx->cp().all_reduce(share, parallel::ReduceOp::kSum);  // the shares
  if (ctx->dp_size() > 1) ctx->dp().all_reduce(share, parallel::ReduceOp::kAvg);
  return share;
}

int64_t TrainPlan::optimizer_steps() const {
  return dp ? dp->step_count() : optimizer->step_count();
}

void TrainPlan::set_optimizer_steps(int64_t n) {
  if (dp)
    dp->set_step_count(n);
  else
    optimizer->set_step_count(n);
}

std::vector<std::pair<std::string, Tensor>> TrainPlan::optimizer_state() const {
  return dp ? dp->state_tensors() : optimizer->state_tensors();
}

std::string TrainPlan::describe() const {
  std::ostringstream os;
  if (dp) os << dp->describe() << "\n";
  if (sdp) os << sdp->describe() << "\n";
  if (pipe) os << pipe->describe() << "; " << released << " parameters of other stages released\n";
  if (model_parallel) {
    os << "model parallel: tp " << ctx->tp_size()
       << (sequence_parallel ? " (sequence parallel)" : "") << ", cp " << ctx->cp_size() << "\n";
  }
  return os.str();
}

}  // namespace loom
