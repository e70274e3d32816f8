// parallel/dp/options.cpp — data parallelism's option checks (see the header).
#include "parallel/dp/options.h"

#include <sstream>
#include <string>

#include "core/error.h"

namespace loom::parallel {
namespace {

template <typename T>
std::string str(const T& v) {  // as the config's other messages print numbers
  std::ostringstream os;
  os << v;
  return os.str();
}
void require(bool ok, const std::string& message) {
  if (!ok) throw ConfigError(message);
}

}  // namespace

void validate(const DpOptions& p) {
  require(p.zero_stage >= 0 && p.zero_stage <= 3,
          "parallel.zero_stage: " + str(p.zero_stage) + " is not supported (0, 1, 2 or 3)");
  require(p.mics_partition_size >= 0,
          "parallel.mics_partition_size: must be non-negative, got " + str(p.mics_partition_size));
  // MiCS partitions the dp·cp reduction group (Note [MiCS groups] in parallel/mesh.h).
  require(
      p.mics_partition_size == 0 || (p.dp * p.cp) % p.mics_partition_size == 0,
      "parallel.mics_partition_size: " + str(p.mics_partition_size) +
          " does not divide parallel.dp " + str(p.dp) +
          (p.cp > 1 ? " × parallel.cp " + str(p.cp) + " = " + str(p.dp * p.cp) : std::string()));
  require(p.mics_partition_size == 0 || p.zero_stage >= 1,
          "parallel.mics_partition_size: MiCS shards optimizer state; set parallel.zero_stage to "
          "1, 2 or 3");
  require(p.bucket_mb > 0, "parallel.bucket_mb: must be positive, got " + str(p.bucket_mb));
}

}  // namespace loom::parallel
