// parallel/odc/options.cpp — ODC's option checks (see the header).
#include "parallel/odc/options.h"

#include <string>

#include "core/error.h"

namespace loom::parallel::odc {

void validate(const OdcChoice& o) {
  if (o.odc && o.zero_stage != 3) {
    throw ConfigError(
        "parallel.odc: ODC pulls parameter shards and pushes gradient pieces of ZeRO-3's layout; "
        "set parallel.zero_stage to 3 (got " +
        std::to_string(o.zero_stage) + ")");
  }
  if (o.deterministic && !o.odc)
    throw ConfigError("parallel.odc_deterministic: needs parallel.odc: true");
  if (o.odc && o.pp != 1) {
    throw ConfigError("parallel.odc: not supported with pipeline parallelism (parallel.pp " +
                      std::to_string(o.pp) + ")");
  }
}

}  // namespace loom::parallel::odc
