// parallel/odc/options.cpp — ODC's option checks (see the header).
#include "parallel/odc/options.h"

#include "core/error.h"

namespace loom::parallel::odc {

void validate(const OdcChoice& o) {
  LOOM_CONFIG_CHECK(!o.odc || o.zero_stage == 3,
                    "parallel.odc: ODC pulls parameter shards and pushes gradient pieces of "
                    "ZeRO-3's layout; set parallel.zero_stage to 3 (got ",
                    o.zero_stage, ")");
  LOOM_CONFIG_CHECK(!o.deterministic || o.odc,
                    "parallel.odc_deterministic: needs parallel.odc: true");
  LOOM_CONFIG_CHECK(!o.odc || o.pp == 1,
                    "parallel.odc: not supported with pipeline parallelism (parallel.pp ", o.pp,
                    ")");
}

}  // namespace loom::parallel::odc
