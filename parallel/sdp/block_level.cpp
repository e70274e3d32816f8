// parallel/sdp/block_level.cpp — the block level's context, holdings and sync slices (see the
// header, Notes [SDP block masking], [SDP block slices]).
#include "parallel/sdp/block_level.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>

#include "core/error.h"

namespace loom::parallel::sdp {
namespace {

void check_worker(const BlockAssignment& cover, int worker, const char* what) {
  LOOM_CHECK(worker >= 0 && worker < cover.workers, what, ": worker ", worker, " outside the ",
             cover.workers, " workers of the block cover");
  LOOM_CHECK(static_cast<int64_t>(cover.holders.size()) == cover.n_layer, what,
             ": the block cover lists holders of ", cover.holders.size(), " blocks, not n_layer ",
             cover.n_layer);
}

// The parameter's name inside its block (its ParamRole).
std::string name_in_block(const Tensor& p) { return p.role()->name; }

}  // namespace

LayerContext block_masking_context(const BlockAssignment& cover, int worker, bool forward_masking) {
  check_worker(cover, worker, "block_masking_context");
  auto selection = std::make_shared<BlockSelection>();
  if (forward_masking) {
    selection->held = cover.owned_blocks(worker);
    selection->residual_scale = static_cast<double>(cover.workers) / cover.replication;
  } else {
    for (int64_t l = 0; l < cover.n_layer; ++l) {
      if (!cover.holds(worker, l)) selection->frozen.push_back(l);
    }
  }
  LayerContext ctx;
  ctx.blocks = std::move(selection);
  return ctx;
}

int64_t block_of_parameter(const std::string& name, const Tensor& p, int64_t n_layer) {
  LOOM_CHECK(p.role() != nullptr, "sdp: parameter '", name,
             "' has no role in a model (a Transformer records them, core/param_role.h)");
  const int64_t l = block_of(p.role());
  LOOM_CHECK(l < n_layer, "sdp: parameter '", name, "' is in block ", l,
             ", not a block of model.n_layer = ", n_layer);
  return l;
}

bool holds_parameter(const BlockAssignment& cover, int worker, const std::string& name,
                     const Tensor& p) {
  check_worker(cover, worker, "holds_parameter");
  const int64_t l = block_of_parameter(name, p, cover.n_layer);
  return l < 0 || cover.holds(worker, l);
}

std::vector<SdpSliceSpec> block_slices(const BlockAssignment& cover,
                                       const std::vector<std::pair<std::string, Tensor>>& params) {
  LOOM_CHECK(static_cast<int64_t>(cover.holders.size()) == cover.n_layer,
             "block_slices: the block cover lists holders of ", cover.holders.size(),
             " blocks, not n_layer ", cover.n_layer);
  // A block's parameter list (names inside the block, in order), the same in every block present.
  std::vector<std::string> layout;
  int64_t layout_block = -1;
  std::map<int64_t, std::vector<size_t>> by_block;  // block → its parameters' indices, in order
  std::vector<size_t> replicated;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t l = block_of_parameter(params[i].first, params[i].second, cover.n_layer);
    if (l < 0) {
      replicated.push_back(i);
    } else {
      by_block[l].push_back(i);
    }
  }
  for (const auto& [l, indices] : by_block) {
    std::vector<std::string> names;
    for (size_t i : indices) names.push_back(name_in_block(params[i].second));
    if (layout_block < 0) {
      layout = names;
      layout_block = l;
      continue;
    }
    for (size_t j = 0; j < std::max(names.size(), layout.size()); ++j) {
      const bool same = j < names.size() && j < layout.size() && names[j] == layout[j];
      LOOM_CHECK(
          same, "block_slices: block ", l, "'s parameter ", j, " (",
          j < names.size() ? "blocks." + std::to_string(l) + "." + names[j] : "none",
          ") differs from block ", layout_block, "'s (",
          j < layout.size() ? "blocks." + std::to_string(layout_block) + "." + layout[j] : "none",
          "): every block must list the same parameters");
    }
  }
  const auto P = static_cast<int64_t>(layout.size());
  LOOM_CHECK(P > 0 || replicated.empty(),
             "block_slices: the parameters hold no block, so the replicated parameters' ids "
             "(after every block's) cannot be placed; a worker holds at least one block");
  std::vector<int> everyone(static_cast<size_t>(cover.workers));
  for (int w = 0; w < cover.workers; ++w) everyone[static_cast<size_t>(w)] = w;

  std::vector<SdpSliceSpec> out;
  for (const auto& [l, indices] : by_block) {
    for (size_t j = 0; j < indices.size(); ++j) {
      SdpSliceSpec s;
      s.id = (cover.n_layer - 1 - l) * P + static_cast<int64_t>(j);
      s.param = indices[j];
      s.holders = cover.holders[static_cast<size_t>(l)];
      out.push_back(std::move(s));
    }
  }
  for (size_t j = 0; j < replicated.size(); ++j) {
    SdpSliceSpec s;
    s.id = cover.n_layer * P + static_cast<int64_t>(j);
    s.param = replicated[j];
    s.holders = everyone;
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(),
            [](const SdpSliceSpec& a, const SdpSliceSpec& b) { return a.id < b.id; });
  return out;
}

SdpSetup block_setup(const BlockAssignment& cover, int worker,
                     const std::vector<std::pair<std::string, Tensor>>& params,
                     std::vector<std::pair<std::string, Tensor>> frozen, bool forward_masking) {
  SdpSetup s;
  s.what = std::string(forward_masking ? "forward" : "backward") + " masking, block level";
  s.publishes = !forward_masking;
  s.workers = cover.workers;
  s.replication = cover.replication;
  s.coverage = cover.coverage;
  s.slices = block_slices(cover, params);
  for (const SdpSliceSpec& x : s.slices) {
    LOOM_CHECK(std::binary_search(x.holders.begin(), x.holders.end(), worker), "SDP: worker ",
               worker, " trains '", params[x.param].first, "' of a block it does not hold");
  }
  if (!frozen.empty()) s.frozen_slices = block_slices(cover, frozen);
  s.frozen = std::move(frozen);
  return s;
}

}  // namespace loom::parallel::sdp
