// parallel/dp/options.cpp — data parallelism's option checks (see the header).
#include "parallel/dp/options.h"

#include <string>

#include "core/error.h"

namespace loom::parallel {

void validate(const DpOptions& p) {
  LOOM_CONFIG_CHECK(p.zero_stage >= 0 && p.zero_stage <= 3, "parallel.zero_stage: ", p.zero_stage,
                    " is not supported (0, 1, 2 or 3)");
  LOOM_CONFIG_CHECK(p.mics_partition_size >= 0,
                    "parallel.mics_partition_size: must be non-negative, got ",
                    p.mics_partition_size);
  // MiCS partitions the dp·cp reduction group (Note [MiCS groups] in parallel/mesh.h).
  LOOM_CONFIG_CHECK(
      p.mics_partition_size == 0 || (p.dp * p.cp) % p.mics_partition_size == 0,
      "parallel.mics_partition_size: ", p.mics_partition_size, " does not divide parallel.dp ",
      p.dp,
      p.cp > 1 ? " × parallel.cp " + std::to_string(p.cp) + " = " + std::to_string(p.dp * p.cp)
               : std::string());
  LOOM_CONFIG_CHECK(
      p.mics_partition_size == 0 || p.zero_stage >= 1,
      "parallel.mics_partition_size: MiCS shards optimizer state; set parallel.zero_stage to "
      "1, 2 or 3");
  LOOM_CONFIG_CHECK(p.bucket_mb > 0, "parallel.bucket_mb: must be positive, got ", p.bucket_mb);
}

}  // namespace loom::parallel
