// parallel/odc/options.h — the config keys ODC reads (parallel.odc, parallel.odc_deterministic;
// train/config.cpp maps the keys) and their checks against the layout (Note [ODC] in
// parallel/odc/odc_gatherer.h).
#pragma once

#include <cstdint>

namespace loom::parallel::odc {

struct OdcChoice {
  bool odc = false;                // ZeRO-3's layout with one-sided transfers
  bool deterministic = false;      // per-origin gradient slots added in rank order
  int64_t zero_stage = 0, pp = 1;  // the layout it must fit
};

// Throws ConfigError naming the key when the choice does not fit the layout.
void validate(const OdcChoice& o);

}  // namespace loom::parallel::odc
