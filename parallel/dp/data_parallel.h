// parallel/dp/data_parallel.h — DataParallel: data parallelism composed from its parts
// (DESIGN §5.10): the gradient buckets and their hooks (GradBuckets, parallel/dp/grad_buckets.h),
// a sync strategy for each complete bucket (all-reduce, reduce-scatter, the two-hop MiCS/HSDP
// one: parallel/dp/grad_sync.h), the sharded optimizer that wraps any optim::Optimizer made by
// the config's factory (parallel/dp/sharded_optimizer.h), and at stage 3 ZeRO-3's parameter
// gatherer installed as the model's unit hooks (parallel/dp/zero3.h). Stages: DDP (0), ZeRO-1
// (optimizer state sharded), ZeRO-2 (+ gradients), ZeRO-3/FSDP (+ parameters), over the data-
// parallel group or over a MiCS partition group with replicas synchronised in a second hop.
// This class holds what joins the parts: which bucket reductions are in flight and their wait,
// the owned pieces the optimizer steps, the step's statistics. It does not own the model or the
// communicators, and never splits the batch: the caller feeds each rank its rows and scales the
// loss for gradient accumulation. It writes the placement of what it replicates and shards
// (Note [Placement] in core/placement.h): every parameter is replicated over config.axes, and
// grad_pieces() says which pieces this rank owns, so the global gradient norm is
// parallel/gradients.h's, as for every layout.
//
// It is a GradientEngine (parallel/engine.h): the trainer drives it through that seam. Used
// directly, per optimiser step with M micro-batches:
//   dp.zero_grad();
//   for m in 0..M-1: dp.set_sync(m == M-1); loss_m = model.loss(rows_m) / M; backward(loss_m);
//   dp.finish_gradient_sync();          // waits for the reductions; gradients are now averaged
//   sq = global_grad_sq_sum(dp.grad_pieces(), &ctx, device);   // parallel/gradients.h
//   dp.step_scaled(lr, optim::clip_scale_tensor(sq, 1.0));     // owned shard, then all-gather
// At stage 3, first install the gatherer: model.set_unit_hooks(dp.unit_hooks()).
//
// Note [Data-parallel gradient flow]: each parameter is re-homed into its bucket's flat
// parameter buffer (Note [Re-homed parameters] in parallel/dp/bucket.h) and its .grad is set to
// the matching view of the bucket's flat gradient buffer before backward, so AccumulateGrad
// adds into the bucket (core/autograd.h). The parameter's grad-ready hook counts its bucket
// down (GradBuckets); when the last gradient of a bucket is final and this is a sync
// micro-batch, DataParallel issues the bucket's reduction asynchronously (the GradSync's first
// hop) and backward continues:
//   stage 0, 1: all_reduce(avg) of the whole bucket over dp;
//   stage 2:    reduce_scatter(avg) over the shard group (dp, or the MiCS partition) into the
//               rank's shard buffer, then, with MiCS, all_reduce(avg) of that shard across the
//               replica group (issued in finish_gradient_sync, in bucket launch order, so that
//               every rank issues the ops of every communicator in the same global order).
// Rank r of the shard group (size S) owns elements [r·n, (r+1)·n) of every bucket, n = padded
// numel / S. Its optimizer (a ShardedOptimizer around the inner one: parallel/dp/
// sharded_optimizer.h) is built over the intersections of parameters with the owned ranges
// (1-d views of the flat parameter buffer, named "<param>[<begin>:<end>]" with element offsets
// in the flattened parameter), so optimiser state exists only for the owned shard; after the
// update every bucket's shard is all-gathered over the shard group. Stage 0 keeps one plain
// optimizer over the whole parameters on every rank.
//
// Note [Early contributions and sparse rows]: at stages 0 and 1 (whole-bucket all-reduces,
// overlap on, dp > 1) two shortcuts serve the gradient that would otherwise be final last and
// reduced whole at the end of backward — a tied embedding's (its output projection runs first
// in backward, its input lookup last):
//   early contributions: a parameter used several times is offered each contribution but the
//     last as it arrives (Note [Partial gradients] in core/autograd.h). On a sync micro-batch
//     its .grad (the earlier micro-batches' sum) plus the contribution is all-reduced (avg) at
//     once, asynchronously, and .grad is zeroed, so the rest of backward overlaps it and the
//     bucket's own reduction carries only the later contributions; finish_gradient_sync adds the
//     two. Accumulation micro-batches decline the offer (the engine sums as before).
//   sparse rows: a tall 2-d host parameter (rows ≥ 8 × columns: embedding tables, and an
//     untied output projection of the same shape) gets a bucket of its own, which on its first
//     sync step is left to finish_gradient_sync, which averages it with dp::all_reduce_rows_avg
//     (parallel/dp/ sparse_rows.h): a row mask all-reduced, then only the rows some rank has
//     non-zero. Each element is the same average either way. A table whose gradient proved sparse
//     (at most half its rows) stays on that path; one whose gradient was dense goes back to being
//     reduced from its hook in backward from the next step on. An input lookup's gradient is
//     sparse: a batch of T tokens touches at most T rows of the table.
// Each rank decides alike (the same graph, the same all-reduced mask), so every communicator
// sees the same operations in the same order everywhere. Not at stages 2-3, on a GPU (the row
// count would need a device synchronisation), or with overlap or table_shortcuts off (the
// measurement baselines). They pay where backward has compute left after the output projection
// (a model whose blocks hold its compute); on gpt2-tiny, whose projection is 88 % of its compute,
// the rows they add cost more than the overlap they buy (docs/performance.md, "Across hosts").
//
// Note [ZeRO-3]: built from parameter units (Note [Parameter units] in layers/transformer.h),
// one bucket per unit; its Zero3Gatherer (parallel/dp/zero3.h) is the model's UnitHooks.
// Between uses a rank holds only its shard of each unit's parameters (param_shard, persistent),
// of its gradients (grad_shard) and of the AdamW state; the unit's flat parameter buffer keeps its
// Storage but the memory is released (Note [Releasable storage] in core/storage.h), so tensors the
// graph saved still point at it. Forward: before_forward(u) all-gathers unit u (waiting for its
// prefetch when one was issued) and issues the gather of unit u+1 asynchronously; after_forward(u)
// releases unit u (unless a tied use still holds it) and wraps the unit's output in an identity
// whose backward calls before_backward(u): gather unit u again (prefetched when possible), issue
// the gather of unit u-1, allocate the unit's flat gradient buffer. When the unit's last gradient
// hook fires, its parameters are released and its gradient buffer is reduce-scattered (avg)
// asynchronously into the shard; the full buffer is freed as soon as that completes. Gradient
// accumulation reduce-scatters every micro-batch and sums the shards (memory stays sharded;
// set_sync() does not defer anything at stage 3). With overlap off (measurement only) the full
// unit gradients are kept and reduce-scattered once, in finish_gradient_sync. MiCS: gathers and
// reduce-scatters run inside the partition; the summed shard is all-reduced (avg) across the
// replica group in finish_gradient_sync, in unit order. Activation checkpointing works unchanged:
// the recomputation runs inside the unit's backward, after its gather. With config.odc the
// gatherer is odc::OdcGatherer instead (parallel/odc/odc_gatherer.h): the same layout and
// schedule, one-sided transfers, one synchronisation per step (Note [ODC]); both are
// dp::UnitGatherers (parallel/dp/unit_gatherer.h), and the plan injects which one
// (DataParallelConfig::gatherer): this folder does not know ODC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/unit_hooks.h"
#include "optim/decay_rule.h"
#include "optim/optimizer.h"
#include "parallel/comm/communicator.h"
#include "parallel/dp/dp_stats.h"
#include "parallel/dp/grad_buckets.h"
#include "parallel/dp/grad_sync.h"
#include "parallel/dp/unit_gatherer.h"
#include "parallel/engine.h"
#include "parallel/gradients.h"
#include "parallel/mesh.h"

namespace loom::parallel {

struct DataParallelConfig {
  int zero_stage = 0;               // 0 (DDP), 1 (optimiser state), 2 (+ gradients), 3 (+ params)
  size_t bucket_bytes = 25u << 20;  // target bytes of gradient per bucket (not with units)
  // Makes the inner optimizer over the owned pieces (stage 0: the whole parameters), each with
  // its decay flag from decay_rule. Empty: AdamW with its default hyper-parameters.
  optim::OptimizerFactory optimizer;
  optim::DecayRule decay_rule = optim::DecayRule::kDefault;
  // The mesh axes the data-parallel group spans ({dp}, or {dp, cp} under context parallelism)
  // and, with MiCS, the replica group's axis: what the placements it writes name.
  Axes axes = {kAxisDp};
  std::string replica_axis = kAxisMicsReplica;
  bool broadcast_parameters = true;  // copy dp rank 0's parameters to every rank at start
  bool overlap = true;  // false: launch every reduction in finish_gradient_sync (for measuring)
  // false: neither shortcut of Note [Early contributions and sparse rows] (for measuring)
  bool table_shortcuts = true;
  // Stage 3 only: makes the parameter gatherer; empty: ZeRO-3's collectives (dp::Zero3Gatherer).
  // The plan sets ODC's here (Note [ODC] in parallel/odc/odc_gatherer.h).
  dp::GathererFactory gatherer;
  // Whether the gatherer needs every rank to run as many micro-batches per step (ZeRO-3's
  // per-unit collectives do; ODC's one-sided transfers do not).
  bool gatherer_equal_micro_batches = true;
};

// MiCS groups: shard within `partition` (size P), replicate across `replica` (size dp / P).
// Both null for plain DP/ZeRO. Members of one replica group hold the same shard index.
struct MicsGroups {
  Communicator* partition = nullptr;
  Communicator* replica = nullptr;
};

class DataParallel final : public GradientEngine {
 public:
  // named: the model's trainable parameters (Module::named_parameters()), identical in order
  // and shapes on every rank; they are re-homed into flat buffers here. The communicators must
  // outlive this object. MiCS needs zero_stage >= 1. Stages 0-2 only.
  DataParallel(const NamedTensors& named, Communicator& dp, const DataParallelConfig& config,
               MicsGroups mics = {});
  // units: the parameters in units (Transformer::parameter_units()), one bucket per unit, any
  // stage; bucket b is unit b. At stage 3 install unit_hooks() as the model's hooks
  // (model.set_unit_hooks(dp.unit_hooks())) before the first forward (Note [ZeRO-3]).
  DataParallel(const std::vector<NamedTensors>& units, Communicator& dp,
               const DataParallelConfig& config, MicsGroups mics = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;
  DataParallel(DataParallel&&) = delete;
  DataParallel& operator=(DataParallel&&) = delete;

  // Stage 3: the ZeRO-3 (or ODC) gatherer, the model's unit hooks; null below stage 3.
  UnitHooks* unit_hooks() { return gatherer_.get(); }

  // Zeroes the gradient buckets and points every parameter's .grad at its bucket view (stage
  // 3: starts a step; unit gradient buffers appear in each unit's backward).
  void zero_grad() override;
  // The engine seam (parallel/engine.h): the last micro-batch arms the sync (set_sync).
  void begin_micro_batch(int64_t m, int64_t count) override { set_sync(m == count - 1); }
  // Stages 0-1 between syncs: the buckets hold this rank's local gradient; while probing, what
  // the probe summed; else undefined.
  Tensor local_grad_sum_squares() override;
  // Stages 0-1: each bucket's Σ g² is taken as it is launched (before its all-reduce, or its
  // deferral to the sparse-rows reduction), and early contributions are declined so that a tied
  // table's gradient reaches its bucket whole (Note [Early contributions and sparse rows]).
  bool probe_unreduced_grads(bool on) override;
  void step(double lr, const Tensor& factor) override { step_scaled(lr, factor); }
  std::vector<HeldPiece> trained_pieces() const override { return owned_pieces(); }
  // Whole local parameters at stages 0-2, the owned shards at stage 3.
  std::vector<HeldPiece> held_parameters() const override;
  NamedTensors optimizer_state() override { return state_tensors(); }
  int64_t optimizer_steps() const override { return step_count(); }
  void set_optimizer_steps(int64_t n) override { set_step_count(n); }
  std::optional<NamedTensors> whole_parameters() override;
  bool collective_forward() const override { return config_.zero_stage == 3; }
  bool equal_micro_batches() const override {
    return config_.zero_stage == 3 && config_.gatherer_equal_micro_batches;
  }
  const DpStepStats* sync_stats() const override { return &log_.last(); }
  std::string describe_end() override { return describe(); }
  // Whether the next backward is the last micro-batch of the step (reductions launch from its
  // hooks). Default true. With false, gradients only accumulate in the buckets. Stage 3
  // reduce-scatters every micro-batch regardless (Note [ZeRO-3]).
  void set_sync(bool sync);
  bool sync() const { return sync_; }
  // Issues any reduction not yet issued, waits for all of them (the exposed wait is recorded),
  // and closes the step's statistics. Gradients are then averaged over dp: whole buckets at
  // stages 0/1, the owned shard at stages 2/3 (stage 3 also releases every gathered unit).
  void finish_gradient_sync();
  // The owned gradients with their placements (Note [Placement]): at stage 0 the whole
  // gradients, replicated over config.axes; at stages 1-3 the owned pieces, which no other rank
  // of the shard group holds (with MiCS, replicated over the replica axis). What the global
  // gradient norm sums (parallel/gradients.h). Calls finish_gradient_sync() first when needed.
  std::vector<HeldPiece> grad_pieces();
  // The owned gradients as views, named like the optimiser state's pieces
  // ("<param>[<begin>:<end>]", stages 1-3) or by parameter (stage 0, whole gradients). Valid
  // after finish_gradient_sync() until step(); writing them changes what step() applies.
  NamedTensors owned_grad_pieces() const;
  // step(lr) with every owned gradient multiplied by grad_scale (a 0-d f64 tensor on the
  // gradients' device, read there: optim::Optimizer::step_scaled).
  void step_scaled(double lr, const Tensor& grad_scale);
  // The optimizer's step on the owned shard with learning rate lr, then all-gathers the parameters
  // (stages 1/2; at stage 3 the next forward gathers them unit by unit).
  void step(double lr);

  // Optimiser state of this rank (Note [Optimizer state contract] in optim/optimizer.h); at
  // stages 1-3 the names carry the shard's element range, e.g. "exp_avg.wte.weight[0:512]".
  std::vector<std::pair<std::string, Tensor>> state_tensors();
  int64_t step_count() const { return optimizer_->step_count(); }
  void set_step_count(int64_t step) { optimizer_->set_step_count(step); }

  DpMemory memory() const;          // measured from the buffers
  DpMemory memory_formula() const;  // Note [ZeRO memory formulas] for this layout
  const DpStepStats& last_step_stats() const { return log_.last(); }
  // Appends a kMarker event to the current step's log, on the same counter as the hooks and
  // launches (Note [Data-parallel event log]); tests call it from backward functions.
  void mark(std::string detail) { log_.log(DpEventKind::kMarker, -1, std::move(detail)); }
  std::string describe() const override;  // layout and memory, one line, for printing at start

  // What this rank owns of each parameter: at stages 1-3 a flat range [begin, end) of it (the
  // optimizer's piece, named "<param>[<begin>:<end>]"), at stage 0 the whole parameter (named
  // by it). `values` is a view (writing it sets the values; at stage 3 the only copy between
  // uses); `placement` says which ranks hold the same piece (Note [Placement]): the
  // parameter's, with the data-parallel axes taken out at stages 1-3 (and the MiCS replica
  // axis in).
  std::vector<HeldPiece> owned_pieces() const;
  // Copies of every whole parameter in the model's order. At stage 3 this all-gathers each
  // unit (collective over the shard group: call it on every rank).
  NamedTensors full_parameters();
  // Stage 3: bytes of gathered parameter buffers now alive (0 between steps).
  int64_t gathered_bytes() const { return gatherer_ ? gatherer_->gathered_bytes() : 0; }

  int zero_stage() const { return config_.zero_stage; }
  int shard_rank() const { return shard_comm_->rank(); }
  int shard_count() const { return shard_comm_->size(); }
  int num_buckets() const { return buckets_->size(); }
  // Parameter names of bucket b, in buffer order.
  std::vector<std::string> bucket_param_names(int b) const { return buckets_->param_names(b); }
  int64_t num_parameters() const { return buckets_->num_parameters(); }

 private:
  struct InFlight {  // stages 0-2: a bucket's reduction, from its launch to the step's wait
    WorkPtr first, second;
  };
  struct Early {  // an early contribution's all-reduce (Note [Early contributions and sparse rows])
    size_t param = 0;
    Tensor sum;  // (numel): the parameter's .grad then plus the contribution, averaged in place
    WorkPtr work;
  };
  enum class RowMode : uint8_t { kUntried, kSparse, kDense };
  struct OwnedRange {  // an optimiser ParamRef: [begin, end) of bucket `bucket`'s flat space
    int bucket = 0;
    int64_t begin = 0, end = 0;
  };

  DataParallel(const std::vector<NamedTensors>& units, Communicator& dp,
               const DataParallelConfig& config, MicsGroups mics, bool per_unit);
  void validate_groups(MicsGroups mics, bool per_unit) const;
  void broadcast_parameters();
  void build_optimizer();
  // An owned piece's placement (stages 1-3): the parameter's, without the data-parallel axes.
  Placement owned_placement(const dp::BucketParam& p) const;
  void on_bucket_complete(int bucket);
  void launch(int bucket, DpEventKind kind);
  // Note [Early contributions and sparse rows]: the partial hook; whether a bucket goes the
  // sparse-rows way this step; that reduction, in finish_gradient_sync.
  bool on_partial(size_t param, const Tensor& g);
  bool rows_candidate(int bucket) const;
  void reduce_rows(int bucket);
  void finish_buckets();
  Tensor piece_grad(size_t k) const;
  void gather_parameters();
  // The engine's part of finish() (Note [Engine step] in parallel/engine.h): the sync, the
  // gradients the norm counts (grad_pieces), and those the pipeline's tied exchange gets —
  // whole at stages 0-1, where the stages' buckets differ (at stage 1 not the norm's owned
  // pieces: exchange_gradients), the owned pieces at stages 2-3.
  void sync() override { finish_gradient_sync(); }
  std::vector<HeldPiece> gradients() override { return grad_pieces(); }
  std::vector<HeldPiece> exchange_gradients() override;
  std::vector<HeldPiece> whole_gradients() const;  // views of the whole gradients (stages 0-1)

  Communicator& dp_;
  Communicator* shard_comm_;    // dp_, or the MiCS partition
  Communicator* replica_comm_;  // MiCS replica group, else null
  DataParallelConfig config_;
  DpStepLog log_;
  std::unique_ptr<dp::GradBuckets> buckets_;
  std::unique_ptr<dp::GradSync> grad_sync_;     // the buckets' sync strategy (grad_sync.h)
  std::unique_ptr<dp::UnitGatherer> gatherer_;  // stage 3: ZeRO-3's or ODC's
  std::vector<InFlight> in_flight_;             // per bucket (stages 0-2)
  std::vector<int> launch_order_;               // buckets in the order their first hop was issued
  std::vector<OwnedRange> ranges_;              // parallel to optimizer_->params() at stages 1-3
  // Stage 0: the inner optimizer over the whole parameters; stages 1-3: a ShardedOptimizer
  // wrapping it over the owned pieces (sharded_optimizer.h).
  std::unique_ptr<optim::Optimizer> optimizer_;
  bool sync_ = true;
  bool probe_ = false;   // probe_unreduced_grads
  Tensor probe_sq_;      // what it summed this step
  bool synced_ = false;  // reductions complete, step not yet taken
  // Note [Early contributions and sparse rows]: whether they apply to this engine; the step's
  // early reductions; per bucket, its row mode, whether it waits for finish_gradient_sync's
  // sparse reduction, and whether an early contribution of its parameter went in backward.
  bool shortcuts_ = false;
  std::vector<Early> early_;
  std::vector<RowMode> row_mode_;
  std::vector<char> deferred_, early_launched_;
};

}  // namespace loom::parallel
