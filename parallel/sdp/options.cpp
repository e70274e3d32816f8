// parallel/sdp/options.cpp — SDP's validation, covers and worker layers (see the header).
#include "parallel/sdp/options.h"

#include <vector>

#include "core/error.h"
#include "parallel/sdp/backward_masking.h"
#include "parallel/sdp/block_level.h"
#include "parallel/sdp/forward_masking.h"

namespace loom::parallel::sdp {
namespace {

CoverOptions cover_options(const SdpOptions& o, int64_t dp) {
  CoverOptions c;
  c.workers = static_cast<int>(workers_of(o, dp));
  c.coverage = o.coverage;
  c.seed = static_cast<uint64_t>(o.seed);
  return c;
}

}  // namespace

int64_t workers_of(const SdpOptions& o, int64_t dp) { return o.workers > 0 ? o.workers : dp; }

void validate(const SdpOptions& s, const SdpLayout& p, const ModelConfig& model) {
  LOOM_CONFIG_CHECK(s.mode == "none" || s.mode == "forward" || s.mode == "backward",
                    "parallel.sdp.mode: unknown mode '" + s.mode + "' (none, forward, backward)");
  LOOM_CONFIG_CHECK(s.level == "neuron" || s.level == "block",
                    "parallel.sdp.level: unknown level '" + s.level + "' (neuron, block)");
  LOOM_CONFIG_CHECK(s.seed >= 0, "parallel.sdp.seed: must be non-negative, got ", s.seed);
  LOOM_CONFIG_CHECK(s.coverage > 0 && s.coverage <= 1,
                    "parallel.sdp.coverage: must be in (0, 1], got ", s.coverage);
  LOOM_CONFIG_CHECK(s.workers >= 0, "parallel.sdp.workers: must be >= 0 (0: parallel.dp), got ",
                    s.workers);
  if (!s.on()) return;
  const int64_t n = workers_of(s, p.dp);
  LOOM_CONFIG_CHECK(n >= 2,
                    "parallel.sdp.mode: SDP needs at least 2 workers (parallel.sdp.workers, or "
                    "parallel.dp when it is 0), got ",
                    n);
  LOOM_CONFIG_CHECK(p.dp % n == 0, "parallel.sdp.workers: ", n, " does not divide parallel.dp ",
                    p.dp, " (the dp group holds parallel.dp / workers copies)");
  LOOM_CONFIG_CHECK(
      p.tp == 1 && p.pp == 1 && p.cp == 1,
      "parallel.sdp.mode: SDP runs over parallel.dp alone; set parallel.tp, parallel.pp and "
      "parallel.cp to 1 (got ",
      p.tp, ", ", p.pp, ", ", p.cp, ")");
  LOOM_CONFIG_CHECK(
      p.zero_stage == 0 && !p.odc && p.mics_partition_size == 0,
      "parallel.sdp.mode: SDP keeps each worker's subnetwork whole; set parallel.zero_stage "
      "to 0 (got ",
      p.zero_stage,
      "), parallel.odc false and "
      "parallel.mics_partition_size 0");
  LOOM_CONFIG_CHECK(!p.packing, "parallel.sdp.mode: data.packing is not supported with SDP yet");
  LOOM_CONFIG_CHECK(
      s.mode != "backward" || !p.init_from,
      "parallel.sdp.mode: model.init_from is not supported with backward masking yet (the "
      "frozen copies are not loaded from it; forward masking supports it)");
  LOOM_CONFIG_CHECK(
      !s.heads || s.level == "neuron",
      "parallel.sdp.heads: attention heads are covered at the neuron level only (a block "
      "holds all its heads; got level " +
          s.level + ")");
  LOOM_CONFIG_CHECK(!s.heads || !model.qk_norm,
                    "parallel.sdp.heads: not with model.qk_norm (the q/k norm weights of heads "
                    "a worker does not hold would be averaged as if every worker held them)");
  if (s.heads) heads_cover(s, model, p.dp);  // ConfigError naming model.n_kv_head, …
  if (s.blocks())
    block_cover(s, model, p.dp);  // ConfigError naming the keys
  else
    neuron_cover(s, model, p.dp);  // ConfigError naming parallel.sdp.coverage, …
}

NeuronAssignment neuron_cover(const SdpOptions& o, const ModelConfig& model, int64_t dp) {
  return assign_neurons(
      cover_options(o, dp),
      std::vector<int64_t>(static_cast<size_t>(model.n_layer), model.ffn_hidden_size()));
}

std::optional<NeuronAssignment> heads_cover(const SdpOptions& o, const ModelConfig& model,
                                            int64_t dp) {
  if (!o.heads) return std::nullopt;
  CoverOptions c = cover_options(o, dp);
  c.seed += 1;
  return assign_neurons(c,
                        std::vector<int64_t>(static_cast<size_t>(model.n_layer), model.kv_heads()),
                        model.n_kv_head > 0 ? "model.n_kv_head" : "model.n_head");
}

BlockAssignment block_cover(const SdpOptions& o, const ModelConfig& model, int64_t dp) {
  return assign_blocks(cover_options(o, dp), model.n_layer);
}

LayerContext worker_layers(const SdpOptions& o, const ModelConfig& model, int64_t dp, int worker) {
  if (o.blocks()) return block_masking_context(block_cover(o, model, dp), worker, o.forward());
  return o.forward() ? forward_masking_context(neuron_cover(o, model, dp), worker,
                                               heads_cover(o, model, dp))
                     : backward_masking_context(neuron_cover(o, model, dp), worker,
                                                heads_cover(o, model, dp));
}

}  // namespace loom::parallel::sdp
