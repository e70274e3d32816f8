// train/planner/step_time.cpp — Note [Step-time model]: a rank's compute from the calibration,
// its groups' collectives from the links, the data-parallel buckets' overlap and the pipeline's
// makespan.
#include "train/planner/step_time.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "layers/transformer.h"
#include "parallel/pp/partition.h"
#include "parallel/pp/schedule.h"
#include "parallel/pp/simulate.h"
#include "parallel/sdp/options.h"
#include "train/planner/dp_backward.h"
#include "train/planner/packed_steps.h"
#include "train/planner/sdp_worker.h"

namespace loom::planner {
namespace {

struct Lin {
  int64_t in, out;
  bool column;  // tensor parallelism splits the output (column) or the input (row)
};

// The linear layers of one block (layers/attention.cpp, layers/mlp.cpp).
std::vector<Lin> block_linears(const ModelConfig& m) {
  const int64_t C = m.n_embd, D = C / m.n_head, q = m.n_head * D, kv = m.kv_heads() * D;
  const int64_t F = m.ffn_hidden_size();
  std::vector<Lin> l = {{C, q + 2 * kv, true}, {q, C, false}};
  if (m.arch == "llama") {
    l.push_back({C, F, true});
    l.push_back({C, F, true});
    l.push_back({F, C, false});
  } else {
    l.push_back({C, F, true});
    l.push_back({F, C, false});
  }
  return l;
}

// The packed run's steps the model reads from the data (Note [Packed step time] in
// train/planner/packed_steps.h): its first ones, at most this many.
constexpr int64_t kPackedPlanSteps = 32;

// A collective's time on a link (Note [Step-time model]).
using Coll = Collective;
// The ring's steps and byte factor of a collective over g ranks.
std::pair<double, double> ring(Coll c, int64_t g) {
  switch (c) {
    case Coll::kAllReduce:
      return {2.0 * (g - 1), 2.0 * (g - 1) / g};
    case Coll::kReduceScatter:
    case Coll::kAllGather:
    case Coll::kGet:  // the g − 1 pieces of a unit, one from (or to) each other owner
    case Coll::kAccumulate:
      return {static_cast<double>(g - 1), static_cast<double>(g - 1) / g};
    case Coll::kSend:
      break;
  }
  return {1.0, 1.0};
}

// idle: issued onto a link nothing else is using (Note [Idle and busy links] in
// train/planner/links.h).
double coll_time(Coll c, double bytes, int64_t g, const LinkModel& link, bool idle = false) {
  if (g <= 1 || bytes <= 0) return 0;
  const CollectiveFit& fit = link.fit(c);
  const auto [steps, factor] = ring(c, g);
  const auto [steps0, factor0] = ring(c, link.ranks);
  const double rate = idle && fit.idle_bytes_per_s > 0 ? fit.idle_bytes_per_s : fit.bytes_per_s;
  return fit.latency_s * steps / steps0 + bytes / rate * factor / factor0;
}

std::string ms(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << s * 1e3 << " ms";
  return o.str();
}

}  // namespace

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kGet:
      return "odc_get";
    case Collective::kAccumulate:
      return "odc_accumulate";
    case Collective::kSend:
      break;
  }
  return "send";
}

ClusterLinks links_from(const Calibration& cal, int64_t ranks_per_host) {
  ClusterLinks l;
  l.ranks_per_host = ranks_per_host;
  for (auto [cls, link] :
       {std::pair<std::string, LinkModel*>{"intra", &l.intra}, {"inter", &l.inter}}) {
    link->ranks = static_cast<int64_t>(cal.link(cls + "/ranks").value_or(2));
    for (Collective c : kCollectives) {
      const std::string key = cls + "/" + collective_name(c);
      link->fit(c) = {cal.link(key + "/latency").value_or(0),
                      cal.link(key + "/bandwidth").value_or(0),
                      cal.link(key + "/idle_bandwidth").value_or(0)};
    }
    const std::string ranks = std::to_string(link->ranks);
    link->compute_slowdown = cal.link(cls + "/slowdown/" + ranks).value_or(1.0);
    link->memory_slowdown = cal.link(cls + "/memory_slowdown/" + ranks).value_or(1.0);
    link->overlap_cost = cal.link(cls + "/overlap_cost/" + ranks).value_or(0.0);
  }
  return l;
}

ClusterLinks links_from_sheet(const DeviceSpec& device, int64_t ranks_per_host) {
  LOOM_CONFIG_CHECK(device.network_bytes_per_s > 0, "--device ", device.name,
                    ": the step time needs a GPU's links (a100, h100, h200)");
  ClusterLinks l;
  l.ranks_per_host = ranks_per_host > 0 ? ranks_per_host : device.gpus_per_host;
  // Note [Data-sheet links]: α per ring step and the ring's link rate, written as the fits a
  // 2-rank calibration would give (coll_time scales them to the group's size).
  const auto sheet = [](LinkModel& link, double step_latency_s, double bytes_per_s) {
    link.ranks = 2;
    link.source = "data sheet";
    for (Collective c : kCollectives) {
      const auto [steps, factor] = ring(c, 2);
      link.fit(c) = {step_latency_s * steps, bytes_per_s / factor, bytes_per_s / factor};
    }
  };
  sheet(l.intra, 3.4e-6, device.link_bytes_per_s / 2);
  sheet(l.inter, 14e-6, device.network_bytes_per_s);
  return l;
}

StepTimePlan plan_step_time(const Config& cfg, Calibration& cal, const ClusterLinks& links) {
  const ModelConfig& m = cfg.model;
  const ParallelConfig& p = cfg.parallel;
  const TrainConfig& t = cfg.train;
  LOOM_CONFIG_CHECK(p.cp == 1 || p.cp_attention == "ring",
                    "parallel.cp_attention: the step-time model prices ring attention only "
                    "(Ulysses' all-to-alls, alone or in hybrid, are not priced yet)");
  LOOM_CONFIG_CHECK(m.recompute != "selective",
                    "model.recompute: the step-time model prices no recompute or full recompute "
                    "only (selective's recomputed ops are not priced yet)");
  LOOM_CONFIG_CHECK(!p.sdp.on() || p.sdp.forward(),
                    "parallel.sdp.mode: the step-time model covers SDP's forward masking only "
                    "(backward masking's publication is not priced yet)");
  LOOM_CONFIG_CHECK(!p.sdp.on() || !p.sdp.heads,
                    "parallel.sdp.heads: the step-time model does not cover SDP's covered heads "
                    "yet");
  LOOM_CONFIG_CHECK(!p.sdp.on() || parallel::sdp::workers_of(p.sdp, p.dp) == p.dp,
                    "parallel.sdp.workers: the step-time model covers one SDP group over all of "
                    "parallel.dp only");
  LOOM_CONFIG_CHECK(p.diloco.islands == 0,
                    "parallel.diloco: the step-time model does not cover DiLoCo yet");
  LOOM_CONFIG_CHECK(
      p.pp == 1 || parallel::pp::stage_placement(parallel::pp::parse_schedule(p.schedule)) ==
                       parallel::pp::StagePlacement::kLooping,
      "parallel.schedule: the step-time model places stages on ranks by the "
      "looping layout only (",
      p.schedule, "'s V placement, both ends of the pipeline on rank 0, is not priced yet)");
  const int64_t dp = p.dp, tp = p.tp, cp = p.cp, pp = p.pp, vpp = p.vpp;
  const int64_t world = dp * tp * cp * pp;
  // The slowest link each group crosses: ranks are placed tp fastest, then cp, dp, pp (Note
  // [Memory timeline]'s mesh order), ranks_per_host consecutive ranks per host.
  auto link_of = [&](int64_t stride, int64_t size) -> const LinkModel& {
    const int64_t per_host = links.ranks_per_host > 0 ? links.ranks_per_host : world;
    const bool crosses = stride * size > per_host;
    const LinkModel& l = crosses ? links.inter : links.intra;
    LOOM_CONFIG_CHECK(size <= 1 || l.known(), "--plan's step time: no measured ",
                      crosses ? "link between hosts" : "link within a host",
                      " (run `train --calibrate-links` under mpirun on the cluster first, or "
                      "plan for a GPU's data sheet with --device a100|h100|h200)");
    return l;
  };
  const LinkModel& tp_link = link_of(1, tp);
  const LinkModel& cp_link = link_of(tp, cp);
  // Gradients are averaged, and ZeRO shards, over the dp·cp ranks holding one tp part
  // (parallel/dp: the dp_cp group): context-parallel ranks reduce like data-parallel ones.
  const int64_t dpc = dp * cp;
  const LinkModel& dp_link = link_of(tp, dpc);
  // ZeRO shards over the shard group: the dp·cp group, or with MiCS its partitions of
  // consecutive members (parallel/mesh.h partition_group); the partitions' corresponding
  // members form the replica groups, over which MiCS all-reduces the gradient shards.
  const int64_t shard = p.mics_partition_size > 0 ? p.mics_partition_size : dpc;
  const int64_t replicas = dpc / shard;
  const LinkModel& shard_link = link_of(tp, shard);
  const LinkModel& replica_link = link_of(tp * shard, replicas);
  const LinkModel& pp_link = link_of(tp * cp * dp, pp);

  // Packed documents (Note [Packed step time] in train/planner/packed_steps.h): the run's first
  // steps read from its data; the calibration's shapes are one row of their mean length.
  const bool packing = cfg.data.packing;
  const PackedSteps packed_plan =
      packing ? plan_packed_steps(cfg, std::min<int64_t>(t.steps, kPackedPlanSteps))
              : PackedSteps{};
  const int64_t B = packing ? 1 : cfg.data.batch_size;
  const int64_t T = packing ? packed_plan.reference : cfg.data.seq_len, Tr = T / cp, rows = B * Tr;
  const int64_t C = m.n_embd, H = m.n_head, KV = m.kv_heads(), D = C / H;
  const std::string& prec = t.precision;
  const double e = static_cast<double>(dtype_size(train_dtype(prec)));
  const double ge = static_cast<double>(dtype_size(train_dtype(t.dtype)));  // gradient bytes
  int64_t micro = pp > 1 ? pipeline_microbatches(cfg) : cfg.optim.grad_accum;

  // One block and the rest at this rank's micro-batch, corrected to its shapes (Note [Compute
  // calibration]). The mesh's layers (tp or cp > 1) compute GPT-2's MLP unfused and the loss
  // vocabulary-parallel, even over one tensor-parallel rank.
  // Packed: positions restart in each document, so the row of M tokens is measured on a model
  // whose position table reaches M (GPT-2's wpe; the passes' cost does not depend on its size).
  ModelConfig measured = m;
  if (packing) measured.max_seq_len = std::max(m.max_seq_len, T);
  PassTimes block = cal.block(measured, t, B, Tr), rest = cal.rest(measured, t, B, Tr);
  const PassTimes block_measured = block;
  std::ostringstream corrections;
  auto add = [](PassTimes& a, const PassTimes& b, double k) {
    a.fwd = std::max(0.0, a.fwd + k * b.fwd);
    a.bwd = std::max(0.0, a.bwd + k * b.bwd);
  };
  const bool gpt2 = m.arch == "gpt2", mesh = tp > 1 || cp > 1;
  const int64_t F = m.ffn_hidden_size(), Vp = m.padded_vocab();
  const int64_t h = H / tp, kvh = std::max<int64_t>(1, KV / tp);
  PassTimes block_parts;  // the block's linears, MLP and attention at the full shape
  if (mesh) {
    const std::vector<Lin> lins = block_linears(m);
    for (size_t i = 0; i < lins.size(); ++i) {
      const Lin& l = lins[i];
      if (gpt2 && i >= 2) continue;  // the MLP, below
      const PassTimes full = cal.linear(rows, l.in, l.out, gpt2, prec);
      add(block_parts, full, 1);
      if (tp == 1) continue;
      add(block,
          l.column ? cal.linear(rows, l.in, l.out / tp, gpt2, prec)
                   : cal.linear(rows, l.in / tp, l.out, gpt2, prec),
          1);
      add(block, full, -1);
    }
    if (gpt2) {
      const PassTimes fused = cal.mlp(rows, C, F, true, prec);
      add(block_parts, fused, 1);
      add(block, cal.mlp(rows, C, F / tp, false, prec), 1);
      add(block, fused, -1);
    }
    const PassTimes attn_full = cal.attention(B, H, KV, Tr, D, prec);
    add(block_parts, attn_full, 1);
    if (tp > 1) {
      add(block, cal.attention(B, h, kvh, Tr, D, prec), 1);
      add(block, attn_full, -1);
      add(rest, cal.linear(rows, C, Vp / tp, false, prec), 1);
      add(rest, cal.linear(rows, C, Vp, false, prec), -1);
      add(rest, cal.cross_entropy(rows, Vp / tp, prec), 1);
      add(rest, cal.cross_entropy(rows, Vp, prec), -1);
      corrections << "; tp: the rank's linears, heads, vocabulary part and loss measured";
    }
    if (p.sequence_parallel) {  // norms, residual adds, dropout on B·T/tp rows
      const PassTimes other{std::max(0.0, block_measured.fwd - block_parts.fwd),
                            std::max(0.0, block_measured.bwd - block_parts.bwd)};
      add(block, other, -(1.0 - 1.0 / tp));
      corrections << "; sp: the rest of a block ÷ tp";
    }
    if (cp > 1) {  // the rank's ring attention (its block kernels and merges), measured
      add(block, cal.ring_attention(B, h, kvh, Tr, D, cp, prec), 1);
      add(block, cal.attention(B, h, kvh, Tr, D, prec), -1);
      corrections << "; cp: the rank's ring attention measured";
    }
    if (gpt2) corrections << "; the mesh's unfused MLP";
  }
  // SDP under forward masking (Note [SDP packed MLP] in parallel/sdp/forward_masking.h): the
  // worker with the most MLP units (neuron level; its MLP measured in place of the full one:
  // GPT-2's unfused below coverage 1) or C·n_layer blocks (block level; the branches' scales,
  // two elementwise ops per block, are not priced).
  SdpWorker sdp;
  int64_t sdp_ffn = F;
  if (p.sdp.on()) {
    int64_t most = -1;
    for (int64_t r = 0; r < dp; ++r) {
      SdpWorker w = sdp_worker(cfg, static_cast<int>(r));
      int64_t widest = 0;
      for (int64_t units : w.ffn) widest = std::max(widest, units);
      if (widest > most) {
        most = widest;
        sdp = std::move(w);
      }
    }
    if (!sdp.ffn.empty()) {
      sdp_ffn = most;
      if (gpt2) {
        add(block, cal.mlp(rows, C, most, !sdp.scaled_mlp_out, prec), 1);
        add(block, cal.mlp(rows, C, F, true, prec), -1);
      } else {
        add(block, cal.linear(rows, C, most, false, prec), 2);
        add(block, cal.linear(rows, C, F, false, prec), -2);
        add(block, cal.linear(rows, most, C, false, prec), 1);
        add(block, cal.linear(rows, F, C, false, prec), -1);
      }
      corrections << "; SDP: the worker's MLP (" << most << " of " << F << " units) measured";
    } else {
      corrections << "; SDP: the worker's " << sdp.blocks.size() << " of " << m.n_layer
                  << " blocks";
    }
  }
  // Ranks sharing a machine compute slower together than alone (train/planner/links.h): the
  // factors measured for this many ranks placed this way.
  const bool one_host = links.ranks_per_host == 0 || links.ranks_per_host >= world;
  const LinkModel& placed = one_host ? links.intra : links.inter;
  const bool contended = world > 1 && placed.ranks == world;
  const double slowdown = contended ? placed.compute_slowdown : 1.0;
  if (slowdown != 1.0) {
    add(block, block, slowdown - 1);
    add(rest, rest, slowdown - 1);
    std::ostringstream k;
    k << "; ×" << std::setprecision(3) << slowdown << " (" << world
      << " ranks computing at once, measured)";
    corrections << k.str();
  }

  // Packed documents: the step's compute from its micro-batches as the ranks meet; the mean
  // micro-batch's block and rest price the data-parallel overlap below.
  double packed_compute = 0, packed_micro = 0;
  if (packing) {
    const bool per_unit = p.zero_stage == 3 && !p.odc && dpc > 1;
    const PackedCompute pc =
        price_packed_steps(packed_plan, m.n_layer, block, rest, cal.attention(B, H, KV, T, D, prec),
                           cal.cross_entropy(B * T, m.padded_vocab(), prec), per_unit);
    packed_compute = pc.compute_s;
    packed_micro = pc.micro_batches;
    block = pc.block;
    rest = pc.rest;
    micro = std::max<int64_t>(1, std::lround(pc.micro_batches));
    std::ostringstream k;
    k << std::setprecision(3) << "; packed: " << packed_plan.steps.size()
      << " steps of the data, blocks and rest measured at 1 × " << T
      << " and priced per document (Note [Packed step time]), "
      << (per_unit ? "each micro-batch waiting for the slowest rank's"
                   : "the slowest rank's micro-batches");
    corrections << k.str();
  }

  // Tensor and context parallelism, per block and micro-batch, on the critical path; forward
  // and backward apart. Backward runs the transpose of each forward collective (the same bytes),
  // and with checkpointing the recomputed forward runs its collectives again.
  const bool recompute = m.recomputes();
  double tp_fwd = 0, tp_bwd = 0, cp_fwd = 0, cp_bwd = 0;
  if (tp > 1) {
    const double act = rows * C * e;
    tp_fwd = p.sequence_parallel ? 2 * coll_time(Coll::kAllGather, act, tp, tp_link) +
                                       2 * coll_time(Coll::kReduceScatter, act, tp, tp_link)
                                 : 2 * coll_time(Coll::kAllReduce, act, tp, tp_link);
    tp_bwd = tp_fwd * (recompute ? 2 : 1);
  }
  if (cp > 1) {
    // The ring passes K,V forward (cp − 1 hops, each behind the compute of its step) and again
    // backward, where the gradient accumulators follow, cp hops each waited for at once
    // (parallel/cp/ring_attention.cpp).
    const double hop = coll_time(Coll::kSend, 2.0 * B * kvh * Tr * D * e, 2, cp_link);
    const PassTimes ring = cal.ring_attention(B, h, kvh, Tr, D, cp, prec);
    // What the compute hides still costs κ of it (Note [Overlap cost] in train/planner/links.h).
    const double k = cp_link.overlap_cost;
    cp_fwd = std::max(0.0, (cp - 1) * hop - ring.fwd) + k * std::min((cp - 1) * hop, ring.fwd);
    cp_bwd = std::max(0.0, (cp - 1) * hop - ring.bwd) + k * std::min((cp - 1) * hop, ring.bwd) +
             cp * hop + (recompute ? cp_fwd : 0);
  }

  // Per global stage (pp·vpp of them; one without a pipeline): forward and backward of one
  // micro-batch, its collectives included.
  const std::vector<int64_t> bounds = parallel::pp::partition_layers(
      sdp.blocks.empty() ? m.n_layer : static_cast<int64_t>(sdp.blocks.size()),
      static_cast<int>(pp * vpp), p.pp_layout);
  const int64_t stages = pp * vpp;
  std::vector<double> sf(stages), sb(stages), scomp(stages);
  for (int64_t g = 0; g < stages; ++g) {
    const double n = static_cast<double>(bounds[g + 1] - bounds[g]);
    const bool last = g == stages - 1;
    sf[g] = n * (block.fwd + tp_fwd + cp_fwd) + (last ? rest.fwd : 0);
    sb[g] = n * (block.bwd + tp_bwd + cp_bwd) + (last ? rest.bwd : 0);
    scomp[g] = n * block.total() + (last ? rest.total() : 0);
  }
  // The slowest rank (its chunks' compute).
  std::vector<double> rank_compute(pp, 0), rank_blocks(pp, 0);
  for (int64_t g = 0; g < stages; ++g) {
    rank_compute[g % pp] += scomp[g];
    rank_blocks[g % pp] += static_cast<double>(bounds[g + 1] - bounds[g]);
  }
  const int64_t slowest =
      std::max_element(rank_compute.begin(), rank_compute.end()) - rank_compute.begin();
  const double blocks_slowest = rank_blocks[slowest];

  // Parameters this rank updates (÷ tp; its stage's; ÷ dp under ZeRO ≥ 1).
  ModelConfig m1 = m, m2 = m;
  m1.n_layer = 1;
  m2.n_layer = 2;
  const double per_block = static_cast<double>(count_parameters(m2) - count_parameters(m1));
  const double outside = static_cast<double>(count_parameters(m1)) - per_block;
  const double ends = pp == 1 ? outside : (slowest == 0 || slowest == pp - 1 ? outside / 2 : 0);
  // An SDP worker's blocks hold its MLP units only: per hidden unit GPT-2's fc row, bias and
  // proj column, Llama's gate, up and down.
  const double unit_params = gpt2 ? 2.0 * C + 1 : 3.0 * C;
  const double block_params = per_block - static_cast<double>(F - sdp_ffn) * unit_params;
  const double stage_params = (blocks_slowest * block_params + ends) / tp;
  const double owned = p.zero_stage >= 1 ? stage_params / shard : stage_params;
  const double optimizer = cal.optimizer(cfg.optim.name, static_cast<int64_t>(owned), t.dtype) *
                           (contended ? placed.memory_slowdown : 1.0);  // memory-bound: its own

  StepTimePlan plan;
  const double compute = packing ? packed_compute : micro * rank_compute[slowest];
  std::ostringstream f;
  if (packing) f << std::setprecision(3) << packed_micro << " (mean) ";
  f << (packing ? "" : std::to_string(micro) + " ") << "micro-batches × (" << blocks_slowest
    << " blocks × " << ms(block.total())
    << (slowest == pp - 1 ? " + rest " + ms(rest.total()) : std::string()) << ")"
    << corrections.str();
  plan.lines.push_back({"compute", compute, f.str()});
  plan.lines.push_back({"optimizer", optimizer,
                        "update of " + std::to_string(static_cast<int64_t>(owned)) +
                            " parameters (measured " + cfg.optim.name + ")"});
  const double tp_s = micro * blocks_slowest * (tp_fwd + tp_bwd),
               cp_s = micro * blocks_slowest * (cp_fwd + cp_bwd);
  if (tp > 1) {
    plan.lines.push_back(
        {"tp collectives", tp_s,
         std::string("per block and micro-batch, of B·T/cp·C: forward ") +
             (p.sequence_parallel ? "2 all-gathers + 2 reduce-scatters" : "2 all-reduces") +
             ", backward their transposes" +
             (recompute ? ", the recomputed forward's again" : "")});
  }
  if (cp > 1) {
    plan.lines.push_back({"cp ring", cp_s,
                          std::string("per block and micro-batch: cp−1 K,V hops forward and "
                                      "backward past the ring's compute, and cp gradient hops") +
                              (recompute ? "; the recomputed forward's again" : "")});
  }

  // Data parallelism: the buckets of the last micro-batch's backward.
  double dp_s = 0;
  if (dpc > 1) {
    const double grad_bytes = stage_params * ge;
    const double bucket = p.bucket_mb * 1e6;
    const double bwd = blocks_slowest * block.bwd + (slowest == pp - 1 ? rest.bwd : 0);
    if (p.sdp.on()) {
      // SDP (Note [SDP overlapped sync] in parallel/sdp/sdp_sync.h): the held slices (the MLP
      // units' rows and columns, or whole blocks) averaged over their k holders as backward
      // finishes them, in buckets; the replicated parameters over all N workers after backward
      // (their set's first bucket holds the embeddings, whose gradient is ready last).
      const double slices =
          blocks_slowest * (sdp.ffn.empty() ? block_params : sdp_ffn * unit_params) * ge;
      const double replicated = stage_params * ge - slices;
      double done = 0, ready_bytes = 0, busy = 0;
      while (ready_bytes < slices) {
        const double n = std::min(bucket, slices - ready_bytes);
        ready_bytes += n;
        const double t_n = coll_time(Coll::kAllReduce, n, sdp.replication, dp_link);
        done = std::max(done, bwd * ready_bytes / slices) + t_n;
        busy += t_n;
      }
      const double hidden = std::max(0.0, busy - std::max(0.0, done - bwd));
      done = std::max(done, bwd) + dp_link.overlap_cost * hidden;
      for (double left = replicated; left > 0; left -= bucket)
        done += coll_time(Coll::kAllReduce, std::min(bucket, left), sdp.workers, dp_link);
      dp_s = done - bwd;
      plan.lines.push_back({"SDP sync", dp_s,
                            "all-reduce of the held slices over their " +
                                std::to_string(sdp.replication) +
                                " holders past the end of backward, then of the replicated "
                                "parameters over the " +
                                std::to_string(sdp.workers) + " workers"});
    } else if (p.zero_stage <= 2) {
      // Note [Buckets on the link] in train/planner/dp_backward.h: ZeRO-2 reduce-scatters the
      // buckets over the shard group, stages 0–1 all-reduce them over dp·cp.
      const bool scatter = p.zero_stage == 2;
      const LinkModel& link = scatter ? shard_link : dp_link;
      const TableSync tables = table_sync(cfg, B * T * dp * micro, ge);
      BackwardShape bs;
      bs.head_bwd = slowest == pp - 1 ? rest.bwd : 0;
      bs.blocks = static_cast<int64_t>(blocks_slowest);
      bs.block_bwd = block.bwd + tp_bwd + cp_bwd;
      if (cp > 1) {
        const Lin qkv = block_linears(m)[0];
        bs.before_ring =
            std::max(0.0, block.bwd - cal.ring_attention(B, h, kvh, Tr, D, cp, prec).bwd -
                              cal.linear(rows, qkv.in, qkv.out / tp, gpt2, prec).bwd);
        bs.ring_waits = true;
      }
      bs.block_bytes = block_params / tp * ge;
      bs.head_bytes = tables.head_bytes;
      bs.early_bytes = tables.early_bytes;
      bs.end_bytes = std::max(0.0, grad_bytes - blocks_slowest * bs.block_bytes - tables.covered) +
                     tables.end_bytes;
      bs.bucket_bytes = bucket;
      bs.overlap = p.overlap;
      const BackwardSync sync = simulate_backward_sync(bs, [&](double n) {
        return scatter ? coll_time(Coll::kReduceScatter, n, shard, shard_link)
                       : coll_time(Coll::kAllReduce, n, dpc, dp_link);
      });
      // What backward hid still costs κ of it (Note [Overlap cost] in train/planner/links.h).
      dp_s = sync.exposed + link.overlap_cost * std::max(0.0, sync.busy - sync.exposed) +
             sync.ring_wait;
      // The tables reduced by rows at the end: a row mask (f32) and the union's rows, and the
      // host's work on them (measured; memory-bound: the ranks' slowdown together).
      double rows_s = 0;
      for (const RowsTable& r : tables.rows) {
        rows_s += coll_time(Coll::kAllReduce, r.rows * 4.0, dpc, dp_link) +
                  coll_time(Coll::kAllReduce, r.used * r.cols * ge, dpc, dp_link) +
                  cal.table_rows(r.rows, r.cols, r.used, r.early, t.dtype) *
                      (contended ? placed.memory_slowdown : 1.0);
      }
      dp_s += rows_s;
      // MiCS's second hop: the shards all-reduced across the replicas after backward.
      const double second_hop =
          scatter ? coll_time(Coll::kAllReduce, grad_bytes / shard, replicas, replica_link) : 0;
      dp_s += second_hop;
      if (p.zero_stage >= 1)
        dp_s += coll_time(Coll::kAllGather, grad_bytes * e / ge, shard, shard_link);
      plan.lines.push_back(
          {"dp gradients", dp_s,
           std::string(scatter ? "reduce-scatter" : "all-reduce") +
               " of the buckets past the end of backward" +
               (tables.early_bytes > 0 ? " (the table's dense part launched after the head)" : "") +
               (sync.ring_wait > 0 ? " + the ring's hops queued behind them" : "") +
               (rows_s > 0 ? " + the tables' rows" : "") +
               (second_hop > 0 ? " + the shards' all-reduce across replicas" : "") +
               (p.zero_stage >= 1 ? " + all-gather of the updated shards" : "")});
    } else {
      // ZeRO-3: each block's gathers (forward, backward) prefetched one unit ahead, its
      // reduce-scatter as backward goes; the last one exposed.
      // ODC pulls and pushes each unit one-sidedly instead (Note [ODC]): the same bytes at the
      // one-sided rates, no per-unit synchronisation, two barriers per step.
      LOOM_CONFIG_CHECK(!p.odc || shard_link.fit(Coll::kGet).bytes_per_s > 0,
                        "parallel.odc: the calibration file has no measured one-sided transfers "
                        "(run `train --calibrate-links` under mpirun again)");
      const Coll gather = p.odc ? Coll::kGet : Coll::kAllGather;
      const Coll scatter = p.odc ? Coll::kAccumulate : Coll::kReduceScatter;
      // A block's gather runs on an idle link where the previous block's compute hides it, else
      // behind the previous gather; a reduce-scatter follows a backward's prefetched gather. The
      // embeddings' and head's forward gathers start on an idle link, their backward ones behind
      // the first blocks' prefetches (a 2-host trace: the tied table's forward gathers 1.10 and
      // 1.09 s, its backward one 2.19 s; Note [Idle and busy links] in train/planner/links.h).
      const double unit_bytes = per_block / tp * e;
      const double ag_idle = coll_time(gather, unit_bytes, shard, shard_link, true);
      const double ag =
          ag_idle <= block.fwd ? ag_idle : coll_time(gather, unit_bytes, shard, shard_link);
      const double rs = coll_time(scatter, per_block / tp * ge, shard, shard_link);
      // The embeddings' and the head's units are each gathered for forward and backward; a tied
      // head is the embeddings' unit, gathered for the embedding's forward, the head's forward and
      // the backward (parallel/dp/unit_gatherer.cpp; Note [ZeRO-3 memory]).
      const double outside_ag = (m.tie_embeddings ? 2 : 1) *
                                    coll_time(gather, outside / tp * e, shard, shard_link, true) +
                                coll_time(gather, outside / tp * e, shard, shard_link);
      // What the blocks hide still costs κ of it (Note [Overlap cost] in train/planner/links.h);
      // ODC's pulls and pushes on a CPU are MPI_Rget/MPI_Raccumulate copies made by the calling
      // thread (parallel/comm/mpi_window.cpp): nothing is hidden.
      const double k = p.odc && t.device == "cpu" ? 1.0 : shard_link.overlap_cost;
      dp_s = micro * (blocks_slowest *
                          (std::max(0.0, ag - block.fwd) + std::max(0.0, ag + rs - block.bwd) +
                           k * (std::min(ag, block.fwd) + std::min(ag + rs, block.bwd))) +
                      outside_ag) +
             coll_time(scatter, outside / tp * ge, shard, shard_link) + rs;
      if (p.odc) {  // finish()'s and publish's barriers: a message's latency around the group
        const auto [steps, _] = ring(Coll::kAllReduce, shard);
        const auto [steps0, __] = ring(Coll::kAllReduce, shard_link.ranks);
        dp_s += 2 * shard_link.fit(Coll::kAllReduce).latency_s * steps / steps0;
      }
      // MiCS: the summed shards all-reduced across the replicas, unit by unit, after backward.
      const double second_hop =
          coll_time(Coll::kAllReduce, stage_params / shard * ge, replicas, replica_link);
      dp_s += second_hop;
      plan.lines.push_back(
          {"dp ZeRO-3", dp_s,
           std::string(p.odc ? "ODC, one-sided: per block and micro-batch: pulls past the "
                               "block's forward and pull + push past its backward; the "
                               "embeddings' and head's pulls"
                             : "per block and micro-batch: gathers past the block's forward and "
                               "gather + reduce-scatter past its backward; the embeddings' and "
                               "head's gathers") +
               (m.tie_embeddings ? " (tied: the table 3 times)" : "") +
               (p.odc ? "; the last pushes; 2 barriers" : "; the last reduce-scatters") +
               (second_hop > 0 ? "; the shards' all-reduce across replicas" : "")});
    }
  }

  // The micro-batches: one after another, or the pipeline schedule's makespan.
  double main_s = compute + tp_s + cp_s;
  double bubble = 0;
  if (pp > 1) {
    namespace ppn = parallel::pp;
    const ppn::ScheduleKind kind = ppn::parse_schedule(p.schedule);
    const ppn::ScheduleShape shape{static_cast<int>(pp), static_cast<int>(vpp),
                                   static_cast<int>(micro)};
    std::vector<std::vector<ppn::Instruction>> lists;
    for (int r = 0; r < pp; ++r) lists.push_back(ppn::make_schedule(kind, shape, r));
    ppn::StageCosts costs;
    const auto us = [](double sec) { return std::max<long>(1, std::lround(sec * 1e6)); };
    for (int64_t g = 0; g < stages; ++g) {
      costs.fwd.push_back(us(sf[g]));
      costs.bwd.push_back(us(sb[g]));
    }
    costs.transfer = std::lround(coll_time(Coll::kSend, rows * C * e, 2, pp_link) * 1e6);
    const ppn::SimulationResult sim = ppn::simulate(shape, lists, &costs);
    LOOM_CHECK(sim.ok, "step-time model: the schedule does not simulate: ", sim.error);
    const double makespan = static_cast<double>(sim.makespan) * 1e-6;
    bubble = std::max(0.0, makespan - main_s);
    main_s = makespan;
    double tied = 0;
    if (m.tie_embeddings) {  // both ways at once (parallel/pp/pipeline.cpp); shards under ZeRO-2/3
      tied = coll_time(Coll::kSend, Vp * C / tp * ge / (p.zero_stage >= 2 ? dpc : 1), 2, pp_link);
    }
    bubble += tied;
    main_s += tied;
    plan.lines.push_back({"pipeline bubble", bubble,
                          "simulate() with each stage's measured times and transfers: makespan − "
                          "the slowest rank's work" +
                              std::string(m.tie_embeddings ? "; the tied table's exchange" : "")});
  }
  const double step = main_s + dp_s + optimizer;
  plan.step_s = step;
  const double tokens =
      packing ? packed_plan.tokens_per_step : static_cast<double>(B) * T * dp * micro;
  plan.tokens_per_s = tokens / step;
  plan.ranks = world;
  // Packed: the FLOPs at the mean document length, as the trainer's log (train/train_step.cpp).
  const double sequences = static_cast<double>(cfg.data.batch_size * dp);
  plan.flops_per_token =
      model_flops_per_token(m, packing ? std::max<int64_t>(1, std::lround(tokens / sequences)) : T);
  return plan;
}

std::string format_step_time(const StepTimePlan& plan, const DeviceSpec* device) {
  std::ostringstream o;
  for (const TimeLine& l : plan.lines)
    o << "  " << std::left << std::setw(18) << l.what << std::right << std::setw(12)
      << ms(l.seconds) << "  " << l.formula << "\n";
  o << "  " << std::left << std::setw(18) << "step" << std::right << std::setw(12)
    << ms(plan.step_s) << "  " << std::fixed << std::setprecision(0) << plan.tokens_per_s
    << " tokens/s";
  if (plan.ranks > 1)
    o << " (" << plan.tokens_per_s / static_cast<double>(plan.ranks) << " per rank)";
  if (device != nullptr && device->bf16_flops > 0) {
    const double mfu = plan.flops_per_token * plan.tokens_per_s /
                       (device->bf16_flops * static_cast<double>(plan.ranks));
    o << std::setprecision(1) << ", MFU " << 100 * mfu << " % of the sheet's "
      << std::setprecision(0) << device->bf16_flops / 1e12 << " TFLOP/s";
  }
  o << "\n";
  return o.str();
}

}  // namespace loom::planner
