// train/plan.cpp — the plan builder (Note [Plan order] in train/plan.h): the model, its pipeline
// stages, the gradient engine and the step runner; and the plan's loss reduction.
#include "train/plan.h"

#include <map>
#include <optional>
#include <sstream>

#include "core/ops/view.h"
#include "optim/adamw.h"
#include "optim/decay_rule.h"
#include "optim/sgd.h"
#include "parallel/diloco/diloco_engine.h"
#include "parallel/dp/data_parallel.h"
#include "parallel/gradients.h"
#include "parallel/local_engine.h"
#include "parallel/mesh_layers.h"
#include "parallel/odc/odc_gatherer.h"
#include "parallel/sdp/sdp_engine.h"
#include "train/profiler.h"

namespace loom {
namespace {

// 1. Tensor, sequence and context parallelism: the model's layers built with the mesh's
// capabilities over the tp and cp groups (parallel/mesh_layers.h); the TP layers place their
// parts, every other parameter is whole on each TP rank.
void apply_model_parallel(TrainPlan& plan, const Config& cfg, const PlanHooks& hooks) {
  parallel::ParallelContext* ctx = plan.ctx;
  bool model_parallel = false;
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
    const std::string& attention = cfg.parallel.cp_attention;
    const bool hybrid = attention == "hybrid";  // parallel/cp/hybrid.h
    LOOM_CONFIG_CHECK(
        !hybrid || ctx->axis_size(parallel::kAxisCpUlysses) == cfg.parallel.cp_ulysses,
        "parallel.cp_ulysses: ", cfg.parallel.cp_ulysses,
        " needs a parallel context whose cp group splits into that many Ulysses "
        "ranks (ParallelOptions::cp_ulysses ",
        ctx->axis_size(parallel::kAxisCpUlysses), ")");
    plan.layers = parallel::mesh_layer_context(
        ctx->tp(), ctx->cp(), cfg.parallel.sequence_parallel, std::move(spans),
        hybrid                   ? parallel::CpAttention::kHybrid
        : attention == "ulysses" ? parallel::CpAttention::kUlysses
                                 : parallel::CpAttention::kRing,
        &ctx->group({parallel::kAxisCpUlysses}), &ctx->group({parallel::kAxisCpRing}));
    model_parallel = true;
    std::ostringstream os;
    os << "model parallel: tp " << ctx->tp_size()
       << (cfg.parallel.sequence_parallel ? " (sequence parallel)" : "") << ", cp "
       << ctx->cp_size()
       << (ctx->cp_size() > 1
               ? " (" + attention + " attention" +
                     (hybrid ? ": ulysses " + std::to_string(cfg.parallel.cp_ulysses) + " × ring " +
                                   std::to_string(ctx->axis_size(parallel::kAxisCpRing))
                             : "") +
                     ")"
               : "")
       << "\n";
    plan.layout += os.str();
  }
  if (cfg.parallel.sdp.on()) {  // Note [SDP plan] in parallel/sdp/sdp_engine.h
    LOOM_CONFIG_CHECK(
        ctx != nullptr && ctx->dp_size() == cfg.parallel.dp && ctx->world_size() == cfg.parallel.dp,
        "parallel.sdp.mode: SDP over parallel.dp ", cfg.parallel.dp,
        " ranks needs a parallel context of that many dp ranks (mpirun -np ", cfg.parallel.dp, ")");
    const int64_t n = parallel::sdp::workers_of(cfg.parallel.sdp, cfg.parallel.dp);
    plan.layers = parallel::sdp::worker_layers(cfg.parallel.sdp, cfg.model, cfg.parallel.dp,
                                               static_cast<int>(ctx->dp_rank() % n));
  }
  // Parameters are built on the device (drawn on the host, so every device starts from the
  // same values); with train.precision ≠ train.dtype the forward casts them (Note [Precision]).
  plan.model = std::make_unique<Transformer>(cfg.model, train_dtype(cfg.train.dtype), plan.device,
                                             plan.layers);
  if (model_parallel) parallel::mark_replicated(plan.model->parameters(), parallel::kAxisTp);
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
  po.costs = parallel::pp::parse_schedule_costs(cfg.parallel.schedule_costs);
  po.cost_group = &ctx->world();  // every rank runs the lists (Note [Schedule costs])
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
  const int64_t released = plan.pipe->release_other_stages(*plan.model);
  plan.layout = plan.pipe->describe() + "; " + std::to_string(released) +
                " parameters of other stages released\n" + plan.layout;
}

// The pipeline's tied embedding, exchanged between the sync and the norm (Note [Engine step] in
// parallel/engine.h).
void add_tied_exchange(TrainPlan& plan) {
  if (!plan.pipe) return;
  parallel::pp::TransformerPipeline* pipe = plan.pipe.get();
  plan.engine->set_exchange(
      [pipe](const std::vector<HeldPiece>& grads) { pipe->sync_tied_gradients(grads); });
}

// 3. The gradient engine (parallel/engine.h): data parallelism and ZeRO over {dp, cp} (under
// context parallelism each cp rank holds part of the same samples' gradients, Note
// [Model-parallel step] in train/step_runner.h), wrapping the optim.* optimizer; SDP's engine;
// or, alone, that optimizer over the trained parameters.
void apply_engine(TrainPlan& plan, const Config& cfg) {
  const ParallelConfig& pc = cfg.parallel;
  const optim::DecayRule rule = optim::parse_decay_rule(cfg.optim.decay_rule);
  parallel::ParallelContext* ctx = plan.ctx;
  if (pc.sdp.on()) {  // Note [SDP plan] in parallel/sdp/sdp_engine.h
    plan.model->set_batch_slice(
        {ctx->dp_rank() * cfg.data.batch_size, pc.dp * cfg.data.batch_size});
    parallel::sdp::SliceSyncOptions so;
    so.bucket_bytes = static_cast<size_t>(pc.bucket_mb * (1 << 20));
    so.timeout_s = pc.comm_timeout_s;
    plan.engine = std::make_unique<parallel::sdp::SdpEngine>(
        pc.sdp, *plan.model, plan.trained(), ctx->dp(), optimizer_factory(cfg.optim), rule,
        std::move(so), static_cast<int>(cfg.optim.grad_accum));
    plan.data_rank = ctx->dp_rank();
    plan.data_ranks = ctx->dp_size();
    return;
  }
  if (pc.dp == 1 && pc.cp == 1) {
    plan.engine = std::make_unique<parallel::LocalEngine>(
        plan.trained(), optimizer_factory(cfg.optim)(optim::make_param_refs(plan.trained(), rule)));
    return;
  }
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
  plan.data_rank = ctx->dp_rank();
  plan.data_ranks = ctx->dp_size();
  parallel::DataParallelConfig c;
  c.zero_stage = static_cast<int>(pc.zero_stage);
  c.bucket_bytes = static_cast<size_t>(pc.bucket_mb * (1 << 20));
  c.overlap = pc.overlap;
  c.table_shortcuts = pc.table_shortcuts;
  if (pc.odc) {  // Note [ODC] in parallel/odc/odc_gatherer.h: ZeRO-3's layout, one-sided moves
    parallel::odc::OdcOptions o;
    o.deterministic = pc.odc_deterministic;
    o.timeout_s = pc.comm_timeout_s;
    c.gatherer = parallel::odc::gatherer_factory(o);
    c.gatherer_equal_micro_batches = false;  // ranks may run different micro-batch counts
  }
  c.optimizer = optimizer_factory(cfg.optim);
  c.decay_rule = rule;
  c.axes = {parallel::kAxisDp, parallel::kAxisCp};
  parallel::MicsGroups mics;
  if (pc.mics_partition_size > 0) {
    mics = {&ctx->group({parallel::kAxisMicsPartition}), &ctx->group({parallel::kAxisMicsReplica})};
  }
  parallel::Communicator& group = ctx->group(c.axes);
  std::unique_ptr<parallel::DataParallel> dp;
  if (plan.pipe && c.zero_stage >= 2) {  // this stage's units (Note [Sharded stages])
    parallel::pp::TransformerPipeline::StageUnits units = plan.pipe->parameter_units();
    dp = std::make_unique<parallel::DataParallel>(units.units, group, c, mics);
    if (c.zero_stage == 3) {
      plan.stage_hooks = std::make_unique<parallel::pp::StageUnitHooks>(*dp->unit_hooks(),
                                                                        std::move(units.buckets));
      plan.model->set_unit_hooks(plan.stage_hooks.get());
    }
  } else if (c.zero_stage == 3) {  // parameters gathered per unit (Note [ZeRO-3])
    dp = std::make_unique<parallel::DataParallel>(plan.model->parameter_units(), group, c, mics);
    plan.model->set_unit_hooks(dp->unit_hooks());
  } else {
    std::vector<std::pair<std::string, Tensor>> named;
    for (const optim::ParamRef& r : optim::make_param_refs(plan.trained(), rule))
      named.emplace_back(r.name, r.param);
    dp = std::make_unique<parallel::DataParallel>(named, group, c, mics);
  }
  plan.engine = std::move(dp);
}

// 4. DiLoCo (Note [DiLoCo] in parallel/diloco/diloco_engine.h): an outer loop around the engine
// just built. The island's data-parallel replicas become replicas island·D.. of islands·D.
void apply_diloco(TrainPlan& plan, const Config& cfg, const PlanHooks& hooks) {
  const parallel::diloco::DilocoOptions& o = cfg.parallel.diloco;
  if (!o.on()) return;
  plan.data_rank += o.island * plan.data_ranks;
  plan.data_ranks *= o.islands;
  if (o.islands > 1) {  // dropout draws the masks of these rows of the all-island batch
    plan.model->set_batch_slice(
        {plan.data_rank * cfg.data.batch_size, plan.data_ranks * cfg.data.batch_size});
  }
  std::map<std::string, int64_t> block;  // Note [Fragments] in parallel/diloco/options.h
  for (const auto& [name, t] : plan.model->named_parameters()) block[name] = block_of(t.role());
  parallel::diloco::DilocoParts parts;
  parts.options = o;
  parts.inner = std::move(plan.engine);
  parts.world = plan.ctx ? &plan.ctx->world() : nullptr;
  parts.ctx = plan.ctx;
  parts.fragments_of = [block, p = o.fragments](const std::string& param, const Shape& shape) {
    return parallel::diloco::fragment_ranges(block.at(param), shape, p);
  };
  parts.op_timeout_s = cfg.parallel.comm_timeout_s;
  parts.total_steps = cfg.train.steps;
  parts.log = hooks.log;
  plan.engine = std::make_unique<parallel::diloco::DilocoEngine>(std::move(parts));
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
  apply_engine(plan, cfg);
  plan.engine->set_context(ctx, device);
  add_tied_exchange(plan);
  const int64_t engine_ranks = plan.data_ranks;  // the replicas the engine averages over
  apply_diloco(plan, cfg, hooks);
  StepRunnerParts parts;
  parts.model = plan.model.get();
  parts.pipe = plan.pipe.get();
  parts.engine = plan.engine.get();
  parts.ctx = ctx;
  parts.layout = plan.layers.layout;
  parts.trace = hooks.trace;
  parts.micro_batches = plan.pipe ? pipeline_microbatches(cfg) : cfg.optim.grad_accum;
  parts.probe_first_micro_batch = cfg.train.noise_scale;
  parts.data_ranks = engine_ranks;
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

std::vector<std::pair<std::string, Tensor>> TrainPlan::parameters() const {
  if (std::optional<parallel::NamedTensors> whole = engine->whole_parameters()) return *whole;
  return model->named_parameters();
}

Tensor TrainPlan::global_loss(Tensor share) const {
  if (ctx == nullptr) return share;
  if (ctx->cp_size() > 1) ctx->cp().all_reduce(share, parallel::ReduceOp::kSum);  // the shares
  if (ctx->dp_size() > 1) ctx->dp().all_reduce(share, parallel::ReduceOp::kAvg);
  return share;
}

bool TrainPlan::collective_forward() const {
  const bool model_parallel = ctx != nullptr && (ctx->tp_size() > 1 || ctx->cp_size() > 1);
  return model_parallel || pipe != nullptr || engine->collective_forward();
}

std::string TrainPlan::describe() const {
  const std::string e = engine->describe();
  return (e.empty() ? "" : e + "\n") + layout;
}

}  // namespace loom
