// train/planner/memory.cpp — the memory plan of a layout (see train/planner/memory.h): this
// rank's parameter tensors and gradient buckets from the config, then the step replayed on a
// byte counter (train/planner/replay.h; a pipeline rank's step: train/planner/pipeline.h).
#include "train/planner/memory.h"

#include <algorithm>
#include <iomanip>
#include <optional>
#include <sstream>

#include "core/checkpoint.h"
#include "core/dtype.h"
#include "core/error.h"
#include "layers/transformer.h"
#include "parallel/diloco/options.h"
#include "parallel/pp/partition.h"
#include "train/planner/pipeline.h"
#include "train/planner/replay.h"
#include "train/planner/sdp_worker.h"
#include "train/planner/zero3.h"

namespace loom::planner {
namespace {

// One trained tensor of the model, in elements, and where a pipeline puts it (core/param_role.h:
// the embeddings are inputs, the final norm and an untied head outputs).
struct ParamTensor {
  int64_t numel = 0;
  enum class Part { kInput, kBlock, kOutput } part = Part::kBlock;
  int64_t block = -1;
  bool table = false;  // wte: the head's weight too when tied
};

// The model's trained tensors in the order the model registers them (layers/transformer.cpp),
// as one of `tp` tensor-parallel ranks holds them (parallel/tp/layers.h: qkv, fc, gate and up
// split by rows, proj and down by columns, the vocabulary by rows; norms, biases of row layers
// and wpe whole), or as an SDP worker holds them.
std::vector<ParamTensor> model_parameters(const ModelConfig& m, int64_t tp = 1,
                                          const SdpWorker* sdp = nullptr) {
  using Part = ParamTensor::Part;
  const int64_t C = m.n_embd, D = m.head_dim(), q = m.n_head * D / tp, kv = m.kv_heads() * D / tp;
  const int64_t V = m.padded_vocab() / tp;
  std::vector<ParamTensor> p = {{V * C, Part::kInput, -1, true}};
  const bool llama = m.is_llama();
  if (!llama) p.push_back({m.max_seq_len * C, Part::kInput});
  for (int64_t l = 0; l < m.n_layer; ++l) {
    if (sdp && !sdp->blocks.empty() &&
        !std::binary_search(sdp->blocks.begin(), sdp->blocks.end(), l))
      continue;
    const int64_t F =
        sdp && !sdp->ffn.empty() ? sdp->ffn[static_cast<size_t>(l)] : m.ffn_hidden_size() / tp;
    const std::vector<int64_t> sizes =
        llama ? std::vector<int64_t>{C, (q + 2 * kv) * C, C * q, C, F * C, F * C, C * F}
              : std::vector<int64_t>{
                    C, C, (q + 2 * kv) * C, q + 2 * kv, C * q, C, C, C, F * C, F, C * F, C};
    for (int64_t n : sizes) p.push_back({n, Part::kBlock, l});
  }
  p.push_back({C, Part::kOutput});
  if (!llama) p.push_back({C, Part::kOutput});
  if (!m.tie_embeddings) p.push_back({V * C, Part::kOutput});
  return p;
}

// The global stages a tensor lives on (parallel/pp/partition.cpp stages_of_parameter): the
// tied table on the first and the last.
std::vector<int> stages_of(const ParamTensor& t, const std::vector<int64_t>& b, bool tied) {
  const int last = static_cast<int>(b.size()) - 2;
  if (t.part == ParamTensor::Part::kInput) {
    if (t.table && tied && last > 0) return {0, last};
    return {0};
  }
  if (t.part == ParamTensor::Part::kOutput) return {last};
  int g = 0;
  while (t.block >= b[static_cast<size_t>(g) + 1]) ++g;
  return {g};
}

int64_t round_up(int64_t n, int64_t k) { return (n + k - 1) / k * k; }

// A pipeline rank's parameter units under ZeRO-2/3 (Note [Sharded stages] in
// parallel/pp/pipeline.h), in elements: its tensors grouped by the model's unit (Note [Parameter
// units] in layers/transformer.h) in run order, with the tied table alone on the first rank and,
// as the tied copy, after the head on the last.
std::vector<int64_t> stage_units(const std::vector<ParamTensor>& params,
                                 const std::vector<int64_t>& boundaries, int64_t n_layer, bool tied,
                                 int stages, int rank,
                                 std::vector<std::vector<int>>* of = nullptr) {
  const bool tied_shared = tied && boundaries.size() > 2;
  std::vector<int64_t> units;
  int64_t tied_copy = 0;
  if (of) of->assign(static_cast<size_t>(n_layer) + 2, {});
  auto add = [&](int64_t u, int64_t n) {
    if (of) (*of)[static_cast<size_t>(u)].push_back(static_cast<int>(units.size()));
    units.push_back(n);
  };
  for (int64_t u = 0; u <= n_layer + 1; ++u) {
    int64_t alone = 0, rest = 0;
    for (const ParamTensor& t : params) {
      const int64_t unit = t.part == ParamTensor::Part::kInput    ? 0
                           : t.part == ParamTensor::Part::kOutput ? n_layer + 1
                                                                  : t.block + 1;
      if (unit != u) continue;
      bool owned = false;
      for (int g : stages_of(t, boundaries, tied)) owned = owned || g % stages == rank;
      if (!owned) continue;
      if (t.table && tied_shared && rank == stages - 1) {
        tied_copy += t.numel;
      } else if (t.table && tied_shared) {
        alone += t.numel;
      } else {
        rest += t.numel;
      }
    }
    if (alone) add(u, alone);
    if (rest) add(u, rest);
  }
  if (tied_copy) add(0, tied_copy);
  return units;
}

// parallel/dp/bucket.cpp plan_buckets: reverse order, closed when the next tensor would pass
// the byte budget; each padded to a multiple of shards·16 elements. Returns padded sizes.
std::vector<int64_t> bucket_sizes(const std::vector<int64_t>& numels, int64_t elem_bytes,
                                  int64_t budget_bytes, int64_t shards) {
  std::vector<int64_t> out;
  int64_t cur = 0;
  bool open = false;
  auto close = [&] {
    if (!open) return;
    out.push_back(round_up(std::max<int64_t>(cur, 1), shards * 16));
    cur = 0;
    open = false;
  };
  for (size_t k = numels.size(); k-- > 0;) {
    if (open && (cur + numels[k]) * elem_bytes > budget_bytes) close();
    cur += numels[k];
    open = true;
  }
  close();
  return out;
}

std::string mib(int64_t bytes) {
  std::ostringstream s;
  const bool small = bytes < (1 << 20);
  s << std::fixed << std::setprecision(2) << static_cast<double>(bytes) / (small ? 1024 : 1 << 20)
    << (small ? " KiB" : " MiB");
  return s.str();
}

// A rank's index in the world (the mesh's order: tp fastest, then cp, dp, pp).
int64_t rank_index(const ParallelConfig& p, const RankCoord& r) {
  return ((r.pp * p.dp + r.dp) * p.cp + r.cp) * p.tp + r.tp;
}

void refuse_unplanned(const Config& c) {
  const ParallelConfig& p = c.parallel;
  auto refuse = [](const std::string& key, const std::string& why) {
    throw ConfigError(key + ": the memory planner does not model " + why + " yet");
  };
  if (p.sdp.on() && !p.sdp.forward()) {
    refuse("parallel.sdp.mode", "backward masking (its frozen copies and publication)");
  }
  if (p.sdp.on() && p.sdp.heads) refuse("parallel.sdp.heads", "SDP's covered attention heads");
  if (p.cp > 1 && p.cp_attention != "ring")  // ulysses, hybrid
    refuse("parallel.cp_attention", p.cp_attention + " attention (its all-to-all buffers)");
}

}  // namespace

MemoryPlan plan_memory(const Config& cfg, const RankCoord& rank) {
  refuse_unplanned(cfg);
  const ModelConfig& m = cfg.model;
  const ParallelConfig& par = cfg.parallel;
  const SdpWorker sdp = sdp_worker(cfg, static_cast<int>(rank.dp));
  const int64_t e = static_cast<int64_t>(dtype_size(train_dtype(cfg.train.dtype)));
  // Gradients are reduced over dp·cp (each cp rank holds part of the same samples' gradients).
  const bool dp = par.dp * par.cp > 1;
  const int64_t zero = dp ? par.zero_stage : 0;
  const int64_t shards =
      !dp ? 1 : (par.mics_partition_size > 0 ? par.mics_partition_size : par.dp * par.cp);
  const int64_t states = cfg.optim.name == "sgd" ? (cfg.optim.momentum > 0 ? 1 : 0) : 2;

  // This rank's tensors: all of them, or those of its pipeline chunks (Note [Pipeline stages
  // and chunks] in parallel/pp/schedule.h).
  const bool pipeline = par.pp > 1;
  const parallel::pp::ScheduleShape shape{static_cast<int>(par.pp), static_cast<int>(par.vpp),
                                          static_cast<int>(pipeline_microbatches(cfg))};
  const std::vector<int64_t> boundaries =
      pipeline ? parallel::pp::partition_layers(m.n_layer, shape.num_global_stages(), par.pp_layout)
               : std::vector<int64_t>{0, m.n_layer};
  std::vector<int64_t> numels;
  for (const ParamTensor& t : model_parameters(m, par.tp, &sdp)) {
    for (int g : stages_of(t, boundaries, m.tie_embeddings)) {
      if (g % shape.stages == rank.pp) {
        numels.push_back(t.numel);
        break;
      }
    }
  }
  int64_t psi = 0;
  for (int64_t n : numels) psi += n;
  // Data parallelism re-homes the parameters into padded buckets (ZeRO-3: one per unit, Note
  // [Parameter units] in layers/transformer.h).
  std::vector<int64_t> buckets = {psi};
  std::vector<std::vector<int>> stage_of;  // pipeline ZeRO-3: the model's unit → the stage's
  if (pipeline && zero >= 2) {             // the stage's units, one bucket each
    buckets = stage_units(model_parameters(m, par.tp), boundaries, m.n_layer, m.tie_embeddings,
                          shape.stages, static_cast<int>(rank.pp), &stage_of);
    for (int64_t& b : buckets) b = round_up(std::max<int64_t>(b, 1), shards * 16);
  } else if (zero == 3) {
    buckets.assign(static_cast<size_t>(m.n_layer) + 2, 0);
    for (const ParamTensor& t : model_parameters(m, par.tp)) {
      const size_t u = t.part == ParamTensor::Part::kInput    ? 0
                       : t.part == ParamTensor::Part::kOutput ? buckets.size() - 1
                                                              : static_cast<size_t>(t.block) + 1;
      buckets[u] += t.numel;
    }
    for (int64_t& b : buckets) b = round_up(std::max<int64_t>(b, 1), shards * 16);
  } else if (dp && !sdp.on) {
    buckets = bucket_sizes(numels, e, static_cast<int64_t>(par.bucket_mb * (1 << 20)), shards);
  }
  int64_t padded = 0;
  for (int64_t b : buckets) padded += b;
  const int64_t shard = padded / shards;

  MemoryPlan plan;
  plan.rank = rank;
  auto line = [&](const std::string& what, int64_t bytes, const std::string& formula) {
    plan.lines.push_back({what, bytes, formula});
  };
  ByteTimeline tl;
  std::vector<ByteTimeline::Id> held;
  auto hold = [&](int64_t bytes) {
    if (bytes > 0) held.push_back(tl.alloc(bytes));
  };
  tl.set_phase("between steps");
  if (zero == 3) {  // the owned shards; the units' full buffers only while gathered
    line("parameters (owned shards)", shard * e, "e·Ψ_padded/N (units)");
    hold(shard * e);
  } else {
    line("parameters", padded * e,
         sdp.on ? "e·Ψ_w (this SDP worker's subnetwork)"
         : dp   ? "e·Ψ_padded (buckets)"
                : "e·Ψ");
    hold(padded * e);
  }
  const int64_t opt_elems = states * (zero >= 1 ? shard : padded);
  line("optimizer state", opt_elems * e,
       std::to_string(states) + "·e·Ψ" + (zero >= 1 ? "/N" : std::string()));
  hold(opt_elems * e);
  if (sdp.on) {  // SdpSync's .grad buffers and SliceSync's buckets (parallel/sdp/sdp_sync.h)
    line("gradients (SDP's buffers)", padded * e, "e·Ψ_w");
    hold(padded * e);
    line("SDP sync buckets", padded * e, "e·Ψ_w (every slice has k ≥ 2 holders)");
    hold(padded * e);
  } else if (dp && zero <= 1) {
    line("gradient buckets", padded * e, "e·Ψ_padded");
    hold(padded * e);
  } else if (zero >= 2) {
    line("gradient shards", shard * e, "e·Ψ_padded/N");
    hold(shard * e);
  }
  // The step's batch: every micro-batch's ids and targets (i32), read before the step. Packed
  // documents (Note [Packed steps] in data/packed_loader.h): micro-batches of one row of at most
  // M = max_tokens_per_microbatch tokens, each with positions and document starts (i32 too),
  // planned full (the most a micro-batch holds: an upper bound) and as many as the rank's
  // batch_size · seq_len tokens fill (all of them under balance none).
  const DataConfig& d = cfg.data;
  const bool packing = d.packing;
  const int64_t budget =
      d.max_tokens_per_microbatch > 0 ? d.max_tokens_per_microbatch : d.batch_size * d.seq_len;
  const int64_t B = packing ? 1 : d.batch_size;
  const int64_t T = packing ? budget : d.seq_len;  // T: the whole sequence
  const int64_t micro = pipeline  ? shape.microbatches
                        : packing ? (d.batch_size * d.seq_len + budget - 1) / budget
                                  : cfg.optim.grad_accum;
  const int64_t batch_bytes = micro * (packing ? 4 : 2) * B * T * 4;
  line("batch", batch_bytes,
       packing ? "4·m·M·4 (ids, targets, positions, document starts; m = ⌈B·T/M⌉ full rows)"
               : "2·m·B·T·4 (ids and targets)");
  hold(batch_bytes);
  plan.persistent_bytes = tl.current();

  ReplayShape s;
  s.llama = m.is_llama();
  s.tied = m.tie_embeddings && !pipeline;  // a pipeline's last stage holds its own copy
  s.head_reads_table = m.tie_embeddings;
  const int64_t blocks = sdp.blocks.empty() ? m.n_layer : static_cast<int64_t>(sdp.blocks.size());
  s.layers = blocks;
  s.checkpointing = m.recomputes();
  if (m.recompute == "selective")  // Note [Selective recompute] in core/checkpoint.h
    s.keep = parse_kept_ops(m.recompute_save, "model.recompute_save");
  s.B = B;
  s.T = T / par.cp;  // this rank's tokens (parallel/cp: two chunks of T/2cp each)
  s.cp = par.cp;
  s.C = m.n_embd;
  s.tp = par.tp;  // this rank's heads, hidden and vocabulary
  s.sp = par.tp > 1 && par.sequence_parallel;
  s.mesh = par.tp > 1 || par.cp > 1;
  s.q = m.n_head * m.head_dim() / par.tp;
  s.kv = m.kv_heads() * m.head_dim() / par.tp;
  s.heads = m.n_head / par.tp;
  s.F = m.ffn_hidden_size() / par.tp;
  s.V = m.padded_vocab() / par.tp;
  s.max_positions = m.max_seq_len;
  // Mixed precision (Note [Precision] in train/config.h): activations in the compute dtype,
  // statistics in f32 for the 16-bit ones (kernels/norm.h norm_stat_dtype).
  const int64_t ce = static_cast<int64_t>(dtype_size(train_dtype(cfg.train.precision)));
  s.e = ce;
  s.w = ce != e ? e : 0;
  s.s = ce < 4 ? 4 : ce;  // statistics, lse and loss rows
  s.cuda = cfg.train.device == "cuda";
  s.dropout = m.dropout > 0;
  s.packed = packing;
  s.block_ffn = sdp.ffn;
  s.scaled_mlp_out = sdp.scaled_mlp_out;
  s.branch_scale = sdp.branch_scale;
  if (zero == 2) {  // the full buckets, from zero_grad to the sync
    line("gradient buckets (during the step)", padded * e, "e·Ψ_padded");
    hold(padded * e);
  }
  const int64_t base = tl.current();
  ReplayGrads grads;
  int64_t activation_peak = 0;
  if (pipeline) {
    PipelineReplay pr;
    pr.kind = parallel::pp::parse_schedule(par.schedule);
    pr.shape = shape;
    pr.rank = static_cast<int>(rank.pp);
    pr.boundaries = boundaries;
    pr.local_grads = !dp;
    const bool ends = rank.pp == 0 || rank.pp == par.pp - 1;
    if (m.tie_embeddings && ends) {  // this rank's table, or its owned shard under ZeRO-2/3
      const int64_t table = m.padded_vocab() / par.tp * m.n_embd;
      pr.tied_exchange_elements = zero >= 2 ? round_up(table, shards * 16) / shards : table;
    }
    // One step on `t`; under ZeRO-3 the stage's units gathered (Note [ZeRO-3 memory]).
    auto step = [&](ByteTimeline& t, ReplayGrads& g, bool late) {
      std::optional<Zero3Units> inner;
      std::optional<StageUnitEvents> units;
      pr.late_sends = late;
      pr.units = nullptr;
      pr.finish_units = nullptr;
      if (zero == 3) {
        inner.emplace(t, buckets, shards, e, late, !par.odc);
        units.emplace(*inner, stage_of);
        pr.units = &*units;
        pr.finish_units = [&inner] { inner->finish(); };
      }
      replay_pipeline_step(t, s, pr, g);
    };
    ByteTimeline early = tl;  // the lower bound: transfers complete at once
    ReplayGrads early_grads;
    step(early, early_grads, false);
    plan.peak_low_bytes = early.peak();
    step(tl, grads, true);
  }
  // The plain runner's micro-batches; ZeRO-3's reductions complete at once (late false) or
  // one unit later (Note [ZeRO-3 memory] in train/planner/zero3.h).
  auto micro_batches = [&](ByteTimeline& t, ReplayGrads& g, bool late) {
    ReplayShape rs = s;
    std::optional<Zero3Units> units;
    if (zero == 3) {
      units.emplace(t, buckets, shards, e, late, !par.odc);
      rs.units = &*units;
    }
    // DDP's table shortcut takes the head's wte gradient in the syncing micro-batch
    // (parallel/dp/data_parallel.cpp on_partial).
    const bool shortcuts = dp && zero <= 1 && par.overlap && par.table_shortcuts && !sdp.on;
    for (int64_t mb = 0; mb < micro; ++mb) {
      rs.keep_weight_grads = !dp && mb == 0;  // a single process's first .grad is the buffer
      rs.tied_partial_taken = shortcuts && mb == micro - 1;
      StageActivations a = replay_forward(t, rs, blocks, true, true);
      if (mb == 0 && late) activation_peak = t.current() - base;
      replay_backward(t, rs, a, 0, g, true, true);
    }
    if (units) units->finish();
  };
  if (!pipeline) {
    ByteTimeline early = tl;
    ReplayGrads early_grads;
    micro_batches(early, early_grads, false);
    plan.peak_low_bytes = early.peak();
    micro_batches(tl, grads, true);
  }
  plan.peak_bytes = tl.peak();
  plan.peak_at = tl.peak_at();
  if (s.cuda) {  // cuBLASLt's and cuDNN's workspaces are not Loom's allocations
    plan.peak_at += " (cuda: Loom's allocations, without the libraries' workspaces)";
  }
  if (!dp) line("gradients (during the step)", psi * e, "e·Ψ, from the first backward");
  if (pipeline) {
    line("step at its peak, above the held", plan.peak_bytes - base,
         "saved activations of the micro-batches in flight, transfer buffers, .grad "
         "(Note [Pipeline memory])");
  } else {
    line("activations (end of forward)", activation_peak,
         "Σ saved per block + head (docs/planning.md)");
  }
  line("step peak", plan.peak_bytes, "replayed (Note [Memory timeline])");
  if (par.diloco.on()) {  // Note [Lanes] in parallel/diloco/island_lanes.h: host vectors
    const parallel::diloco::DilocoOptions& o = par.diloco;
    const int64_t island_ranks = par.dp * par.pp * par.cp * par.tp;
    const int64_t lanes = o.lanes > 0 ? o.lanes : island_ranks;
    if (rank_index(par, rank) < lanes) {
      const int64_t per_lane = (count_parameters(m) + lanes - 1) / lanes;
      const bool momentum = o.outer != "average" && o.outer_momentum > 0;
      const bool residual = o.bits() > 0 && o.error_feedback;
      const int64_t vectors = 1 + (momentum ? 1 : 0) + (residual ? 1 : 0);
      line("DiLoCo outer state (host memory, apart)", vectors * per_lane * 4,
           std::to_string(vectors) + "·4·Ψ/L (outer weights" + (momentum ? ", momentum" : "") +
               (residual ? ", quantisation residual" : "") + "; L = " + std::to_string(lanes) +
               " lanes), plus a lane's gather buffer during an exchange");
    }
  }
  if (par.odc && zero == 3) {  // Note [ODC] in parallel/odc/odc_gatherer.h
    const int64_t grad_window = par.odc_deterministic ? shards * shard : shard;
    line("ODC windows (MPI's memory, apart)", (shard + grad_window) * e,
         par.odc_deterministic ? "e·Ψ_padded/N (parameters) + e·Ψ_padded (per-origin slots)"
                               : "2·e·Ψ_padded/N (parameters, gradients)");
  }
  if (plan.peak_low_bytes != plan.peak_bytes) {
    line("step peak, transfers complete at once", plan.peak_low_bytes,
         "the lower bound (Note [Pipeline memory], Note [ZeRO-3 memory])");
  }
  return plan;
}

std::vector<MemoryPlan> plan_memory_all(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  std::vector<MemoryPlan> out;
  for (int64_t pp = 0; pp < p.pp; ++pp)
    for (int64_t dp = 0; dp < p.dp; ++dp)
      for (int64_t cp = 0; cp < p.cp; ++cp)
        for (int64_t tp = 0; tp < p.tp; ++tp) out.push_back(plan_memory(cfg, {dp, pp, cp, tp}));
  return out;
}

std::string format_memory_plan(const MemoryPlan& plan) {
  std::ostringstream o;
  const RankCoord& r = plan.rank;
  o << "rank (dp " << r.dp << ", pp " << r.pp << ", cp " << r.cp << ", tp " << r.tp << ")\n";
  for (const MemoryLine& l : plan.lines) {
    o << "  " << std::left << std::setw(36) << l.what << std::right << std::setw(12) << mib(l.bytes)
      << "   " << l.formula << "\n";
  }
  o << "  peak at: " << plan.peak_at << "\n";
  return o.str();
}

}  // namespace loom::planner
