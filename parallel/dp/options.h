// parallel/dp/options.h — the config keys data parallelism reads (parallel.zero_stage,
// parallel.mics_partition_size, parallel.bucket_mb; train/config.cpp maps the keys) and their
// checks against the layout, so the scheme's rules live with the scheme.
#pragma once

#include <cstdint>

namespace loom::parallel {

struct DpOptions {
  int64_t dp = 1, cp = 1;           // the reduction group is dp·cp ranks
  int64_t zero_stage = 0;           // 0 DDP, 1 optimizer state, 2 + gradients, 3 + parameters
  int64_t mics_partition_size = 0;  // > 0: MiCS partitions of the dp·cp group
  double bucket_mb = 25;            // gradient bucket size
};

// Throws ConfigError naming the key when the options do not fit (Note [MiCS groups] in
// parallel/mesh.h).
void validate(const DpOptions& o);

}  // namespace loom::parallel
