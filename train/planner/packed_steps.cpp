// train/planner/packed_steps.cpp — a packed run's steps from its data and their compute (Note
// [Packed step time] in train/planner/packed_steps.h).
#include "train/planner/packed_steps.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "data/packed_loader.h"
#include "train/trainer.h"

namespace loom::planner {
namespace {

// A micro-batch's documents: the runs of equal doc_start (Note [Packed documents] in
// kernels/attention.h).
std::vector<int64_t> documents_of(const MicroBatch& mb) {
  const int64_t L = mb.tokens();
  if (!mb.doc_start.defined()) return {L};
  const int32_t* start = mb.doc_start.data<int32_t>();
  std::vector<int64_t> docs;
  for (int64_t i = 0; i < L; ++i) {
    if (i == 0 || start[i] != start[i - 1]) docs.push_back(0);
    ++docs.back();
  }
  return docs;
}

}  // namespace

PackedSteps plan_packed_steps(const Config& cfg, int64_t steps) {
  LOOM_CONFIG_CHECK(cfg.data.packing, "data.packing: the config does not pack documents");
  const ParallelConfig& p = cfg.parallel;
  const int64_t ranks = p.dp;
  const bool equal = p.zero_stage == 3 && !p.odc;  // ZeRO-3 with collectives pads the ranks
  const std::vector<std::string> shards = expand_shards(cfg.data.train, "data.train");
  PackedSteps out;
  out.steps.assign(static_cast<size_t>(steps), std::vector<RankMicroBatches>(ranks));
  double tokens = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    const PackingOptions po = packing_options(cfg, r, ranks, equal);
    out.budget = po.max_tokens;
    PackedLoader loader(shards, po);
    for (int64_t s = 0; s < steps; ++s) {
      const PackedStep step = loader.next();
      for (const MicroBatch& mb : step.micro) {
        out.steps[static_cast<size_t>(s)][static_cast<size_t>(r)].push_back(
            {documents_of(mb), mb.loss_tokens});
      }
      if (r == 0) tokens += static_cast<double>(step.global_tokens);
    }
  }
  out.tokens_per_step = tokens / static_cast<double>(std::max<int64_t>(steps, 1));
  double micro_tokens = 0, micro_batches = 0;
  for (const std::vector<RankMicroBatches>& step : out.steps)
    for (const RankMicroBatches& rank : step)
      for (const PackedMicroBatch& mb : rank) {
        for (int64_t n : mb.documents) micro_tokens += static_cast<double>(n);
        ++micro_batches;
      }
  const int64_t mean = std::lround(micro_tokens / std::max(1.0, micro_batches));
  out.reference = std::clamp<int64_t>((mean + 63) / 64 * 64, 64, std::max<int64_t>(out.budget, 64));
  return out;
}

PackedCompute price_packed_steps(const PackedSteps& plan, int64_t n_layer, const PassTimes& block,
                                 const PassTimes& rest, const PassTimes& attention,
                                 const PassTimes& loss, bool sync_per_unit) {
  const double M = static_cast<double>(plan.reference);
  const double layers = static_cast<double>(n_layer);
  PackedCompute out;
  int64_t count = 0;
  // One micro-batch's time (Note [Packed step time]); its block and rest summed into out's.
  auto price = [&](const PackedMicroBatch& mb) {
    double L = 0, sq = 0;
    const double l = static_cast<double>(mb.loss_tokens) / M;
    for (int64_t s : mb.documents) {
      L += static_cast<double>(s);
      sq += static_cast<double>(s) * static_cast<double>(s);
    }
    const double f = L / M, a = sq / (M * M);
    const PassTimes b{std::max(0.0, block.fwd - attention.fwd) * f + attention.fwd * a,
                      std::max(0.0, block.bwd - attention.bwd) * f + attention.bwd * a};
    const PassTimes r{std::max(0.0, rest.fwd - loss.fwd) * f + loss.fwd * l,
                      std::max(0.0, rest.bwd - loss.bwd) * f + loss.bwd * l};
    out.block.fwd += b.fwd;
    out.block.bwd += b.bwd;
    out.rest.fwd += r.fwd;
    out.rest.bwd += r.bwd;
    ++count;
    return layers * b.total() + r.total();
  };
  for (const std::vector<RankMicroBatches>& step : plan.steps) {
    std::vector<std::vector<double>> times(step.size());
    size_t most = 0;
    for (size_t r = 0; r < step.size(); ++r) {
      for (const PackedMicroBatch& mb : step[r]) times[r].push_back(price(mb));
      most = std::max(most, times[r].size());
    }
    double compute = 0, micro = 0;
    if (sync_per_unit) {  // micro-batch m waits for every rank's m-th
      for (size_t m = 0; m < most; ++m) {
        double slowest = 0;
        for (const std::vector<double>& t : times)
          if (m < t.size()) slowest = std::max(slowest, t[m]);
        compute += slowest;
      }
      micro = static_cast<double>(most);
    } else {  // the slowest rank's sum
      for (const std::vector<double>& t : times) {
        double sum = 0;
        for (double x : t) sum += x;
        if (sum >= compute) {
          compute = sum;
          micro = static_cast<double>(t.size());
        }
      }
    }
    out.compute_s += compute;
    out.micro_batches += micro;
  }
  const double steps = static_cast<double>(std::max<size_t>(plan.steps.size(), 1));
  out.compute_s /= steps;
  out.micro_batches /= steps;
  const double n = static_cast<double>(std::max<int64_t>(count, 1));
  out.block = {out.block.fwd / n, out.block.bwd / n};
  out.rest = {out.rest.fwd / n, out.rest.bwd / n};
  return out;
}

}  // namespace loom::planner
