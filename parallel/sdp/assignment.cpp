// parallel/sdp/assignment.cpp — the SDP covers (see parallel/sdp/assignment.h, Notes [SDP cover],
// [SDP block cover] and [SDP holder graph]).
#include "parallel/sdp/assignment.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/philox.h"

namespace loom::parallel::sdp {
namespace {

// Philox streams (offsets) of the two draws, far apart so they never share a counter.
constexpr uint64_t kRotationStream = 0;
constexpr uint64_t kBlockStream = uint64_t{1} << 40;

// A draw in [0, m) from 32 random bits (multiply-shift: exact, platform-independent).
int64_t draw_below(uint32_t bits, int64_t m) {
  return static_cast<int64_t>((static_cast<uint64_t>(bits) * static_cast<uint64_t>(m)) >> 32);
}

int mod(int64_t a, int n) { return static_cast<int>(((a % n) + n) % n); }

std::string list_str(const std::vector<int>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ",";
    s += std::to_string(v[i]);
  }
  return s + "}";
}

// The cover of `units` units by N workers with k holders each and rotation r.
LayerCover make_cover(int64_t units, int workers, int k, int rotation) {
  LayerCover c;
  c.units = units;
  c.rotation = rotation;
  c.slices.resize(workers);
  for (int s = 0; s < workers; ++s) {
    UnitSlice& slice = c.slices[s];
    slice.begin = s * units / workers;
    slice.end = (s + 1) * units / workers;
    for (int j = 0; j < k; ++j) slice.holders.push_back(mod(int64_t{s} - rotation - j, workers));
    std::sort(slice.holders.begin(), slice.holders.end());
  }
  return c;
}

std::vector<std::vector<int>> nonempty_holder_sets(const LayerCover& c) {
  std::vector<std::vector<int>> sets;
  for (const UnitSlice& s : c.slices)
    if (s.size() > 0) sets.push_back(s.holders);
  return sets;
}

}  // namespace

Level parse_level(const std::string& s) {
  if (s == "neuron") return Level::kNeuron;
  if (s == "block") return Level::kBlock;
  throw ConfigError("parallel.sdp.level: expected neuron or block, got '" + s + "'");
}

std::string level_name(Level level) { return level == Level::kNeuron ? "neuron" : "block"; }

int replication(int workers, double coverage) {
  LOOM_CONFIG_CHECK(workers >= 1, "parallel.dp: SDP needs at least one worker, got ", workers);
  LOOM_CONFIG_CHECK(std::isfinite(coverage) && coverage > 0 && coverage <= 1,
                    "parallel.sdp.coverage: must be in (0, 1], got ", coverage);
  const double k = coverage * workers;
  const long long rounded = std::llround(k);
  LOOM_CONFIG_CHECK(std::abs(k - static_cast<double>(rounded)) <= 1e-6 * workers && rounded >= 1,
                    "parallel.sdp.coverage: every unit is held by coverage × parallel.dp "
                    "workers, which must be a whole number: ",
                    coverage, " × ", workers, " = ", std::to_string(k));
  return static_cast<int>(rounded);
}

std::vector<int> LayerCover::slices_of(int worker) const {
  std::vector<int> out;
  for (int s = 0; s < static_cast<int>(slices.size()); ++s)
    if (holds(worker, s)) out.push_back(s);
  return out;
}

bool LayerCover::holds(int worker, int slice) const {
  LOOM_CHECK(slice >= 0 && slice < static_cast<int>(slices.size()), "sdp: slice ", slice,
             " out of range [0, ", slices.size(), ")");
  const std::vector<int>& h = slices[slice].holders;
  return std::binary_search(h.begin(), h.end(), worker);
}

std::vector<std::pair<int64_t, int64_t>> LayerCover::owned_ranges(int worker) const {
  LOOM_CHECK(worker >= 0 && worker < static_cast<int>(slices.size()), "sdp: worker ", worker,
             " out of range [0, ", slices.size(), ")");
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int s : slices_of(worker)) {
    const UnitSlice& slice = slices[s];
    if (slice.size() == 0) continue;
    if (!out.empty() && out.back().second == slice.begin) {
      out.back().second = slice.end;
    } else {
      out.emplace_back(slice.begin, slice.end);
    }
  }
  return out;
}

std::vector<int64_t> LayerCover::owned_units(int worker) const {
  std::vector<int64_t> out;
  for (const auto& [b, e] : owned_ranges(worker))
    for (int64_t u = b; u < e; ++u) out.push_back(u);
  return out;
}

int64_t LayerCover::owned_count(int worker) const {
  int64_t n = 0;
  for (const auto& [b, e] : owned_ranges(worker)) n += e - b;
  return n;
}

std::vector<int64_t> NeuronAssignment::owned_units(int worker, int layer) const {
  LOOM_CHECK(layer >= 0 && layer < static_cast<int>(layers.size()), "sdp: layer ", layer,
             " out of range [0, ", layers.size(), ")");
  return layers[layer].owned_units(worker);
}

std::vector<std::vector<int>> NeuronAssignment::holder_sets() const {
  std::vector<std::vector<int>> sets;
  for (const LayerCover& c : layers)
    for (auto& s : nonempty_holder_sets(c)) sets.push_back(std::move(s));
  return distinct_holder_sets(std::move(sets));
}

NeuronAssignment assign_neurons(const CoverOptions& options, const std::vector<int64_t>& units,
                                const std::string& units_key) {
  NeuronAssignment a;
  a.workers = options.workers;
  a.replication = replication(options.workers, options.coverage);
  a.coverage = options.coverage;
  a.seed = options.seed;
  const int n = options.workers;
  for (size_t l = 0; l < units.size(); ++l) {
    LOOM_CONFIG_CHECK(units[l] >= n, units_key, ": layer ", l, " has ", units[l],
                      " units, fewer than the ", n,
                      " SDP workers (parallel.dp); every worker's slice would not be filled");
    const int rotation = static_cast<int>(
        draw_below(philox_bits(options.seed, kRotationStream, static_cast<uint64_t>(l)), n));
    a.layers.push_back(make_cover(units[l], n, a.replication, rotation));
  }
  check_holder_graph(n, a.holder_sets());
  return a;
}

bool BlockAssignment::holds(int worker, int64_t block) const {
  LOOM_CHECK(block >= 0 && block < n_layer, "sdp: block ", block, " out of range [0, ", n_layer,
             ")");
  const std::vector<int>& h = holders[block];
  return std::binary_search(h.begin(), h.end(), worker);
}

std::vector<int64_t> BlockAssignment::owned_blocks(int worker) const {
  std::vector<int64_t> out;
  for (int64_t p : cover.owned_units(worker)) out.push_back(block_order[p]);
  std::sort(out.begin(), out.end());
  return out;
}

int BlockAssignment::slice_of(int64_t block) const {
  LOOM_CHECK(block >= 0 && block < n_layer, "sdp: block ", block, " out of range [0, ", n_layer,
             ")");
  const auto p = std::find(block_order.begin(), block_order.end(), block) - block_order.begin();
  for (int s = 0; s < static_cast<int>(cover.slices.size()); ++s)
    if (p >= cover.slices[s].begin && p < cover.slices[s].end) return s;
  LOOM_FAIL("sdp: block ", block, " is in no slice");
}

std::vector<std::vector<int>> BlockAssignment::holder_sets() const {
  return distinct_holder_sets(nonempty_holder_sets(cover));
}

BlockAssignment assign_blocks(const CoverOptions& options, int64_t n_layer) {
  BlockAssignment a;
  a.workers = options.workers;
  a.replication = replication(options.workers, options.coverage);
  a.coverage = options.coverage;
  a.seed = options.seed;
  a.n_layer = n_layer;
  const int n = options.workers, k = a.replication;
  LOOM_CONFIG_CHECK(n_layer >= 1, "model.n_layer: must be >= 1, got ", n_layer);
  LOOM_CONFIG_CHECK((n_layer * k) % n == 0,
                    "parallel.sdp.coverage: at the block level each worker holds coverage × "
                    "model.n_layer blocks, which must be a whole number: ",
                    options.coverage, " × ", n_layer, " = ", static_cast<double>(n_layer * k) / n);
  // The seeded permutation (Fisher–Yates on Philox draws).
  a.block_order.resize(n_layer);
  std::iota(a.block_order.begin(), a.block_order.end(), int64_t{0});
  for (int64_t i = n_layer - 1; i > 0; --i) {
    const uint32_t bits = philox_bits(options.seed, kBlockStream, static_cast<uint64_t>(i));
    std::swap(a.block_order[i], a.block_order[draw_below(bits, i + 1)]);
  }
  a.cover = make_cover(n_layer, n, k, /*rotation=*/0);
  a.holders.resize(n_layer);
  for (const UnitSlice& s : a.cover.slices)
    for (int64_t p = s.begin; p < s.end; ++p) a.holders[a.block_order[p]] = s.holders;
  check_holder_graph(n, a.holder_sets(), "model.n_layer");
  return a;
}

std::vector<std::vector<int>> distinct_holder_sets(std::vector<std::vector<int>> sets) {
  for (auto& s : sets) {
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
  }
  std::sort(sets.begin(), sets.end());
  sets.erase(std::unique(sets.begin(), sets.end()), sets.end());
  return sets;
}

std::vector<std::vector<int>> holder_components(int workers,
                                                const std::vector<std::vector<int>>& sets) {
  std::vector<int> parent(workers);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (const auto& set : sets) {
    for (int w : set)
      LOOM_CHECK(w >= 0 && w < workers, "sdp: holder ", w, " out of range [0, ", workers, ")");
    for (size_t i = 1; i < set.size(); ++i) {
      const int a = find(set[0]), b = find(set[i]);
      if (a != b) parent[std::max(a, b)] = std::min(a, b);
    }
  }
  std::vector<std::vector<int>> comps;
  std::vector<int> index(workers, -1);  // component index by root
  for (int w = 0; w < workers; ++w) {
    const int r = find(w);
    if (index[r] < 0) {
      index[r] = static_cast<int>(comps.size());
      comps.emplace_back();
    }
    comps[index[r]].push_back(w);
  }
  return comps;
}

void check_holder_graph(int workers, const std::vector<std::vector<int>>& sets,
                        const std::string& extra_keys) {
  const auto comps = holder_components(workers, sets);
  if (comps.size() <= 1) return;
  std::string parts;
  for (size_t i = 0; i < comps.size() && i < 4; ++i) {
    if (i > 0) parts += " ";
    parts += list_str(comps[i]);
  }
  if (comps.size() > 4) parts += " …";
  std::string keys = "parallel.sdp.coverage, parallel.dp";
  if (!extra_keys.empty()) keys += ", " + extra_keys;
  throw ConfigError(keys + ": the SDP holder graph is not connected (" +
                    std::to_string(comps.size()) +
                    " groups of workers that share no slice: " + parts +
                    "), so they would train separate models; raise parallel.sdp.coverage (every "
                    "slice needs two holders or more; at the block level, every worker two "
                    "blocks or more)");
}

}  // namespace loom::parallel::sdp
