// train/planner/search.cpp — layouts that fit (see train/planner/search.h).
#include "train/planner/search.h"

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "train/planner/memory.h"

namespace loom::planner {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t k = 1; k <= n; ++k)
    if (n % k == 0) d.push_back(k);
  return d;
}

std::string describe(const ParallelConfig& p, bool checkpointing) {
  std::ostringstream o;
  o << "dp " << p.dp;
  if (p.tp > 1) o << " × tp " << p.tp << (p.sequence_parallel ? " (sp)" : "");
  if (p.pp > 1) o << " × pp " << p.pp;
  if (p.cp > 1) o << " × cp " << p.cp;
  if (p.dp * p.cp > 1) o << ", ZeRO-" << p.zero_stage;
  if (checkpointing) o << ", checkpointing";
  return o.str();
}

// The largest step peak over the ranks (ranks of one pp stage plan alike: every dp, cp and tp
// coordinate holds the same shapes).
int64_t largest_peak(const Config& c) {
  int64_t peak = 0;
  for (int64_t r = 0; r < c.parallel.pp; ++r)
    peak = std::max(peak, plan_memory(c, {0, r, 0, 0}).peak_bytes);
  return peak;
}

}  // namespace

std::vector<LayoutCandidate> search_layouts(const Config& base, int64_t gpus,
                                            const DeviceSpec& device) {
  LOOM_CONFIG_CHECK(gpus >= 1, "--gpus: expected a positive number of GPUs, got ", gpus);
  // The config's global batch stays: micro-batches of data.batch_size sequences, accumulated
  // (or pipelined) as many times as the data-parallel degree leaves.
  const int64_t global = global_batch_sequences(base), micro = base.data.batch_size;
  std::vector<LayoutCandidate> out;
  for (int64_t tp : divisors(gpus)) {
    for (int64_t pp : divisors(gpus / tp)) {
      for (int64_t cp : divisors(gpus / tp / pp)) {
        const int64_t dp = gpus / tp / pp / cp;
        for (int64_t zero : {0, 1, 2, 3}) {
          if (zero > 0 && dp * cp == 1) continue;
          for (bool ckpt : {false, true}) {
            LayoutCandidate c;
            c.config = base;
            ParallelConfig& p = c.config.parallel;
            p.dp = dp;
            p.tp = tp;
            p.pp = pp;
            p.cp = cp;
            p.zero_stage = zero;
            p.sequence_parallel = tp > 1;
            p.mics_partition_size = 0;
            p.odc = false;
            c.config.model.recompute = ckpt ? "full" : "none";
            c.layout = describe(p, ckpt);
            c.config.parallel.microbatches = 0;
            if (global % (micro * dp) != 0) {
              c.reason = "the global batch of " + std::to_string(global) +
                         " sequences does not split into micro-batches of " +
                         std::to_string(micro) + " over dp " + std::to_string(dp);
              out.push_back(std::move(c));
              continue;
            }
            c.config.optim.grad_accum = global / (micro * dp);
            std::ostringstream set;
            set << "--set parallel.dp=" << dp << " --set parallel.tp=" << tp
                << " --set parallel.pp=" << pp << " --set parallel.cp=" << cp
                << " --set parallel.zero_stage=" << zero
                << " --set parallel.sequence_parallel=" << (tp > 1 ? "true" : "false")
                << " --set model.recompute=" << (ckpt ? "full" : "none")
                << " --set optim.grad_accum=" << c.config.optim.grad_accum
                << " --set parallel.microbatches=0";
            c.overrides = set.str();
            try {
              validate_config(c.config);
              c.peak_bytes = largest_peak(c.config);
              c.fits = fits(c.peak_bytes, device);
              if (!c.fits) c.reason = format_fit(c.peak_bytes, device).substr(2);
            } catch (const ConfigError& e) {
              c.reason = e.what();
            }
            out.push_back(std::move(c));
          }
        }
      }
    }
  }
  auto key = [](const LayoutCandidate& c) {
    const ParallelConfig& p = c.config.parallel;
    return std::make_tuple(!c.fits, c.peak_bytes == 0, p.tp * p.pp * p.cp, p.zero_stage,
                           c.config.model.recomputes(), p.pp, p.cp);
  };
  std::stable_sort(out.begin(), out.end(), [&](const LayoutCandidate& a, const LayoutCandidate& b) {
    return key(a) < key(b);
  });
  return out;
}

void rank_by_step_time(std::vector<LayoutCandidate>& candidates, Calibration& cal,
                       const ClusterLinks& links) {
  for (LayoutCandidate& c : candidates) {
    if (!c.fits) continue;
    try {
      const StepTimePlan t = plan_step_time(c.config, cal, links);
      c.step_s = t.step_s;
      c.tokens_per_s = t.tokens_per_s;
    } catch (const ConfigError& e) {
      c.reason = std::string("speed not predicted: ") + e.what();
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const LayoutCandidate& a, const LayoutCandidate& b) {
                     auto rank = [](const LayoutCandidate& c) {
                       return c.fits ? (c.tokens_per_s > 0 ? 0 : 1) : 2;
                     };
                     if (rank(a) != rank(b)) return rank(a) < rank(b);
                     return a.tokens_per_s > b.tokens_per_s;
                   });
}

std::string format_search(const std::vector<LayoutCandidate>& candidates, int64_t gpus,
                          const DeviceSpec& device) {
  std::ostringstream o;
  int64_t fit = 0;
  bool ranked = false;
  for (const LayoutCandidate& c : candidates) {
    fit += c.fits ? 1 : 0;
    ranked = ranked || c.tokens_per_s > 0;
  }
  o << fit << " of " << candidates.size() << " layouts of " << gpus << " × " << device.name
    << (ranked ? " fit (ranked by predicted tokens/s: train --plan --time, docs/planning.md)\n"
               : " fit (listed by least model splitting, not by predicted speed: add --time, "
                 "docs/planning.md)\n");
  const double gib = static_cast<double>(int64_t{1} << 30);
  for (const LayoutCandidate& c : candidates) {
    o << "  " << (c.fits ? "fits " : "no   ") << std::left << std::setw(46) << c.layout;
    if (c.peak_bytes > 0)
      o << std::right << std::fixed << std::setprecision(2) << std::setw(9) << c.peak_bytes / gib
        << " GiB";
    if (c.tokens_per_s > 0)
      o << std::fixed << std::setprecision(0) << std::setw(10) << c.tokens_per_s << " tok/s"
        << std::setprecision(1) << std::setw(9) << c.step_s * 1e3 << " ms";
    if (!c.reason.empty()) o << "   " << c.reason;
    if (ranked && c.tokens_per_s > 0) o << "   " << c.overrides;
    o << "\n";
  }
  return o.str();
}

}  // namespace loom::planner
