// parallel/sdp/options.h — SDP's options (config parallel.sdp.*; train/config.cpp maps the keys
// onto this struct), their validation against the rest of the layout, the covers they draw and
// the layers of one worker (the model's build context: Note [SDP plan] in
// parallel/sdp/sdp_engine.h). Everything SDP decides before the model exists.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "layers/build_context.h"
#include "layers/model_config.h"
#include "parallel/sdp/assignment.h"

namespace loom::parallel::sdp {

struct SdpOptions {
  std::string mode = "none";     // none | forward | backward (the masking regime)
  std::string level = "neuron";  // neuron | block (what a subnetwork is made of)
  double coverage = 1.0;         // C: the fraction of each layer's units a worker holds
  int64_t seed = 0;              // the cover's draw
  int64_t workers = 0;           // N, the SDP group; 0: parallel.dp (dp / N data-parallel copies)
  bool heads = false;            // neuron level, forward masking: attention heads covered too

  bool on() const { return mode != "none"; }
  bool forward() const { return mode == "forward"; }
  bool blocks() const { return level == "block"; }
};

// What the rest of the run says that SDP must agree with.
struct SdpLayout {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1;
  int64_t zero_stage = 0, mics_partition_size = 0;
  bool odc = false, packing = false, init_from = false;
};

// N: workers, or dp when it is 0.
int64_t workers_of(const SdpOptions& o, int64_t dp);

// Throws ConfigError naming the parallel.sdp key (or the key it conflicts with) when the options
// do not fit the layout or the model; draws the covers (cheap) so that their errors — coverage,
// holder graph, sizes — come at load time. Nothing to check when SDP is off.
void validate(const SdpOptions& o, const SdpLayout& layout, const ModelConfig& model);

// The covers: every block's MLP hidden units (neuron level), its KV groups (the heads option,
// drawn with seed + 1 so that it differs from the MLP's), or the blocks (block level).
NeuronAssignment neuron_cover(const SdpOptions& o, const ModelConfig& model, int64_t dp);
std::optional<NeuronAssignment> heads_cover(const SdpOptions& o, const ModelConfig& model,
                                            int64_t dp);
BlockAssignment block_cover(const SdpOptions& o, const ModelConfig& model, int64_t dp);

// The layers of worker `worker` (0..N−1) for either regime at either level.
LayerContext worker_layers(const SdpOptions& o, const ModelConfig& model, int64_t dp, int worker);

}  // namespace loom::parallel::sdp
