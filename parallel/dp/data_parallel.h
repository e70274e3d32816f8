// parallel/dp/data_parallel.h — DataParallel: gradient buckets reduced asynchronously from the
// autograd hooks while backward runs (DDP), and the ZeRO stages that shard optimiser state
// (stage 1), gradients (stage 2) and parameters (stage 3, FSDP) over the dp group, or over a MiCS
// partition group with replicas synchronised in a second hop. Owns the optimiser, any
// optim::Optimizer made by the config's factory over the owned shard (AdamW, SGD, a fork's):
// the sharded optimizer wraps the inner one, which sees only 1-d pieces of the parameters.
// Does not own the model or the communicators, and never splits the batch: the caller feeds
// each rank its rows and scales the loss for gradient accumulation. It writes the placement of
// what it replicates and shards (Note [Placement] in core/placement.h): every parameter is
// replicated over config.axes, and grad_pieces() says which pieces this rank owns, so the
// global gradient norm is parallel/gradients.h's, as for every layout.
//
// Use, per optimiser step with M micro-batches:
//   dp.zero_grad();
//   for m in 0..M-1: dp.set_sync(m == M-1); loss_m = model.loss(rows_m) / M; backward(loss_m);
//   dp.finish_gradient_sync();          // waits for the reductions; gradients are now averaged
//   sq = global_grad_sq_sum(dp.grad_pieces(), &ctx, device);   // parallel/gradients.h
//   dp.step_scaled(lr, optim::clip_scale_tensor(sq, 1.0));     // owned shard, then all-gather
//
// Note [Data-parallel gradient flow]: each parameter is re-homed into its bucket's flat
// parameter buffer (Note [Re-homed parameters] in parallel/dp/bucket.h) and its .grad is set to
// the matching view of the bucket's flat gradient buffer before backward, so AccumulateGrad
// adds into the bucket (core/autograd.h). The parameter's grad-ready hook counts its bucket
// down; when the last gradient of a bucket is final and this is a sync micro-batch, the hook
// issues the bucket's reduction asynchronously and backward continues:
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
// Note [ZeRO-3]: built from parameter units (Note [Parameter units] in layers/transformer.h),
// one bucket per unit, and installed as the model's UnitHooks. Between uses a rank holds only
// its shard of each unit's parameters (param_shard, persistent), of its gradients (grad_shard)
// and of the AdamW state; the unit's flat parameter buffer keeps its Storage but the memory is
// released (Note [Releasable storage] in core/storage.h), so tensors the graph saved still
// point at it. Forward: before_forward(u) all-gathers unit u (waiting for its prefetch when one
// was issued) and issues the gather of unit u+1 asynchronously; after_forward(u) releases unit
// u (unless a tied use still holds it) and wraps the unit's output in an identity whose
// backward calls before_backward(u): gather unit u again (prefetched when possible), issue the
// gather of unit u-1, allocate the unit's flat gradient buffer. When the unit's last gradient
// hook fires, its parameters are released and its gradient buffer is reduce-scattered (avg)
// asynchronously into the shard; the full buffer is freed as soon as that completes. Gradient
// accumulation reduce-scatters every micro-batch and sums the shards (memory stays sharded;
// set_sync() does not defer anything at stage 3). With overlap off (measurement only) the full
// unit gradients are kept and reduce-scattered once, in finish_gradient_sync. MiCS: gathers and
// reduce-scatters run inside the partition; the summed shard is all-reduced (avg) across the
// replica group in finish_gradient_sync, in unit order. Activation checkpointing works unchanged:
// the recomputation runs inside the unit's backward, after its gather.
//
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/unit_hooks.h"
#include "optim/decay_rule.h"
#include "optim/optimizer.h"
#include "parallel/comm/communicator.h"
#include "parallel/dp/bucket.h"
#include "parallel/dp/dp_stats.h"
#include "parallel/dp/grad_sync.h"
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
};

// MiCS groups: shard within `partition` (size P), replicate across `replica` (size dp / P).
// Both null for plain DP/ZeRO. Members of one replica group hold the same shard index.
struct MicsGroups {
  Communicator* partition = nullptr;
  Communicator* replica = nullptr;
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class DataParallel final : public UnitHooks {
 public:
  // named: the model's trainable parameters (Module::named_parameters()), identical in order
  // and shapes on every rank; they are re-homed into flat buffers here. The communicators must
  // outlive this object. MiCS needs zero_stage >= 1. Stages 0-2 only.
  DataParallel(const NamedTensors& named, Communicator& dp, const DataParallelConfig& config,
               MicsGroups mics = {});
  // units: the parameters in units (Transformer::parameter_units()), one bucket per unit, any
  // stage; bucket b is unit b. At stage 3 install the result as the model's hooks
  // (model.set_unit_hooks(&dp)) before the first forward (Note [ZeRO-3]).
  DataParallel(const std::vector<NamedTensors>& units, Communicator& dp,
               const DataParallelConfig& config, MicsGroups mics = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;
  DataParallel(DataParallel&&) = delete;
  DataParallel& operator=(DataParallel&&) = delete;

  // Zeroes the gradient buckets and points every parameter's .grad at its bucket view (stage
  // 3: starts a step; unit gradient buffers appear in each unit's backward).
  void zero_grad();
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
  std::vector<GradPiece> grad_pieces();
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
  const DpStepStats& last_step_stats() const { return last_stats_; }
  // Appends a kMarker event to the current step's log, on the same counter as the hooks and
  // launches (Note [Data-parallel event log]); tests call it from backward functions.
  void mark(std::string detail) { log(DpEventKind::kMarker, -1, std::move(detail)); }
  std::string describe() const;  // layout and memory, one line, for printing at start

  // UnitHooks (Note [ZeRO-3]); no-ops below stage 3.
  void before_forward(int unit) override;
  Tensor after_forward(int unit, const Tensor& out) override;

  // The parameter values this rank owns, named "<param>[<begin>:<end>]" like the optimiser
  // state (stages 1-3; views: writing them sets the values), or every whole parameter at
  // stage 0. At stage 3 this is the only copy of the parameters between uses.
  NamedTensors parameter_shards() const;
  // Copies of every whole parameter in the model's order. At stage 3 this all-gathers each
  // unit (collective over the shard group: call it on every rank).
  NamedTensors full_parameters();
  // Stage 3: bytes of gathered parameter buffers now alive (0 between steps).
  int64_t gathered_bytes() const { return gathered_bytes_; }

  int zero_stage() const { return config_.zero_stage; }
  int shard_rank() const { return shard_comm_->rank(); }
  int shard_count() const { return shard_comm_->size(); }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Parameter names of bucket b, in buffer order.
  std::vector<std::string> bucket_param_names(int b) const;
  int64_t num_parameters() const;  // Ψ: elements over all parameters

 private:
  struct Param {
    std::string name;
    Tensor tensor;
    bool decay = true;
    int bucket = 0;
    int64_t offset = 0;  // in the bucket's flat buffers
  };
  struct PendingReduce {  // stage 3: a reduce-scatter in flight
    WorkPtr work;
    Tensor grad_flat;  // kept alive until the reduction has read it
    Tensor partial;    // the result, to add into grad_shard; undefined: written there directly
  };
  struct Bucket {
    dp::BucketPlan plan;
    Tensor param_flat;  // (padded_numel); at stage 3 released between uses
    Tensor grad_flat;   // (padded_numel); at stage 2 undefined between the sync and zero_grad
    Tensor grad_shard;  // (shard_numel), stages 2 and 3
    int pending = 0;    // hooks still to fire in this backward
    bool launched = false;
    WorkPtr first, second;
    // Stage 3 (Note [ZeRO-3]).
    Tensor param_shard;     // (shard_numel) the owned parameter values
    bool gathered = false;  // param_flat materialised (its gather may still be in flight)
    WorkPtr gather;
    int forward_uses = 0;
    bool shard_written = false;  // grad_shard holds this step's first reduction
    std::vector<PendingReduce> reduces;
  };
  struct Piece {  // an optimiser ParamRef: [begin, end) of bucket `bucket`'s flat space
    int bucket = 0;
    int64_t begin = 0, end = 0;
  };
  struct HookLink {
    DataParallel* owner = nullptr;
  };

  DataParallel(const std::vector<NamedTensors>& units, Communicator& dp,
               const DataParallelConfig& config, MicsGroups mics, bool per_unit);
  void validate_groups(MicsGroups mics, bool per_unit) const;
  // Calls fn(bucket, param, lo, hi) for every intersection [lo, hi) (bucket elements) of a
  // parameter with this rank's owned range, in bucket then buffer order.
  template <typename Fn>
  void for_each_owned_piece(Fn&& fn) const;
  void build_buckets(const std::vector<NamedTensors>& units, bool per_unit);
  void broadcast_parameters();
  void build_optimizer();
  void install_hooks();
  void on_grad_ready(size_t index, Tensor& leaf);
  Tensor piece_grad(size_t k) const;
  void ensure_grad_buffer(Bucket& b);
  void attach_grad_view(size_t index);
  void launch(int bucket, DpEventKind kind);
  void reset_counters();
  void log(DpEventKind kind, int bucket, std::string detail);
  void gather_parameters();
  // Stage 3 (parallel/dp/zero3.cpp).
  void init_shards();
  void gather_unit(int unit, bool prefetch);
  void wait_unit(int unit);
  void release_unit(int unit);
  void before_backward(int unit);
  void unit_gradients_ready(int unit);
  void launch_unit(int unit, DpEventKind kind);
  void finish_reduce(Bucket& b);
  void reap_reductions();
  void finish_zero3();
  void track_bytes(int64_t param_delta, int64_t grad_delta);

  Communicator& dp_;
  Communicator* shard_comm_;    // dp_, or the MiCS partition
  Communicator* replica_comm_;  // MiCS replica group, else null
  DataParallelConfig config_;
  std::unique_ptr<dp::GradSync> grad_sync_;  // the buckets' sync strategy (grad_sync.h)
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<int> launch_order_;  // buckets in the order their first hop was issued
  std::vector<Piece> pieces_;      // parallel to optimizer_->params() at stages 1/2
  // Stage 0: the inner optimizer over the whole parameters; stages 1-3: a ShardedOptimizer
  // wrapping it over the owned pieces (sharded_optimizer.h).
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<HookLink> link_;
  bool sync_ = true;
  bool synced_ = false;  // reductions complete, step not yet taken
  uint64_t next_seq_ = 0;
  DpStepStats current_, last_stats_;
  int64_t gathered_bytes_ = 0, peak_gathered_bytes_ = 0;    // stage 3 parameter buffers
  int64_t unit_grad_bytes_ = 0, peak_unit_grad_bytes_ = 0;  // stage 3 full gradient buffers
};

}  // namespace loom::parallel
