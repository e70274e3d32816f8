// parallel/sdp/head_slices.cpp — the sync slices of the packed attention (see the header, Note
// [SDP head slices]).
#include "parallel/sdp/head_slices.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/placement.h"
#include "parallel/sdp/neuron_masking.h"

namespace loom::parallel::sdp {
namespace {

// The parameter's name inside its block (its ParamRole, core/param_role.h), "" outside blocks.
std::string role_in_block(const Tensor& t) { return block_of(t.role()) >= 0 ? t.role()->name : ""; }

bool is_qkv(const Tensor& t) {
  const std::string r = role_in_block(t);
  return r == "attn.qkv.weight" || r == "attn.qkv.bias";
}

// Per block: the indices into params of its packed attention parameters, in params' order.
std::map<int64_t, std::vector<size_t>> packed_by_block(
    const NeuronAssignment& heads, const std::vector<std::pair<std::string, Tensor>>& params) {
  const auto n_layer = static_cast<int64_t>(heads.layers.size());
  std::map<int64_t, std::vector<size_t>> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params[i].first;
    if (!is_packed_head_parameter(params[i].second)) continue;
    const int64_t l = block_of(params[i].second.role());
    LOOM_CHECK(l >= 0 && l < n_layer, "SDP heads: attention parameter '", name,
               "' is not in a block of the heads cover (", n_layer, " layers)");
    LOOM_CHECK(params[i].second.placement().split_over(kAxisSdp) != nullptr,
               "SDP heads: attention parameter '", name,
               "' is not packed over the kv groups (a model built without the heads option)");
    out[l].push_back(i);
  }
  return out;
}

int64_t pieces_of(const Tensor& t) { return is_qkv(t) ? 3 : 1; }

// P of Note [SDP head slices]: the most pieces of any block.
int64_t pieces_per_block(const std::map<int64_t, std::vector<size_t>>& blocks,
                         const std::vector<std::pair<std::string, Tensor>>& params) {
  int64_t most = 0;
  for (const auto& [l, members] : blocks) {
    int64_t n = 0;
    for (size_t i : members) n += pieces_of(params[i].second);
    most = std::max(most, n);
  }
  return most;
}

}  // namespace

bool is_packed_head_parameter(const Tensor& p) {
  return is_qkv(p) || role_in_block(p) == "attn.proj.weight";
}

int64_t head_slice_id_span(const NeuronAssignment& heads,
                           const std::vector<std::pair<std::string, Tensor>>& params) {
  return static_cast<int64_t>(heads.layers.size()) * heads.workers *
         pieces_per_block(packed_by_block(heads, params), params);
}

std::vector<SdpSliceSpec> head_slices(const NeuronAssignment& heads, int worker,
                                      const std::vector<std::pair<std::string, Tensor>>& params,
                                      int64_t id_base, bool held) {
  LOOM_CHECK(worker >= 0 && worker < heads.workers, "SDP heads: worker ", worker, " outside the ",
             heads.workers, " SDP workers");
  const auto n_layer = static_cast<int64_t>(heads.layers.size());
  const int64_t n = heads.workers;
  const auto blocks = packed_by_block(heads, params);
  const int64_t per_block = pieces_per_block(blocks, params);
  std::vector<SdpSliceSpec> out;
  for (const auto& [l, members] : blocks) {
    const LayerCover& cover = heads.layers[static_cast<size_t>(l)];
    // Q and R = Q + 2K from the block's proj and qkv weights' global shapes.
    int64_t q_rows = -1, all_rows = -1;
    for (size_t i : members) {
      const Placement p = params[i].second.placement();
      const std::string role = role_in_block(params[i].second);
      if (role == "attn.qkv.weight") all_rows = p.global_shape.at(0);
      if (role == "attn.proj.weight") q_rows = p.global_shape.at(1);
    }
    LOOM_CHECK(q_rows > 0 && all_rows > q_rows, "SDP heads: block ", l,
               " lacks its packed attn.qkv.weight or attn.proj.weight");
    const int64_t u = cover.units;
    LOOM_CHECK((all_rows - q_rows) % (2 * u) == 0 && q_rows % u == 0, "SDP heads: block ", l,
               "'s attention (", q_rows, " q rows of ", all_rows,
               " qkv rows) is not whole heads of the cover's ", u, " kv groups (model.n_kv_head)");
    const int64_t d = (all_rows - q_rows) / (2 * u), qd = q_rows / u, kv_rows = u * d;
    int64_t position = 0;  // p of the parameter's first piece
    for (size_t i : members) {
      const std::string& name = params[i].first;
      const Placement placement = params[i].second.placement();
      const PlacementSplit* split = placement.split_over(kAxisSdp);
      const bool qkv = is_qkv(params[i].second);
      for (int s = 0; s < static_cast<int>(cover.slices.size()); ++s) {
        const UnitSlice& us = cover.slices[static_cast<size_t>(s)];
        if (us.size() == 0 || cover.holds(worker, s) != held) continue;
        std::vector<std::pair<int64_t, int64_t>> pieces = {{us.begin * qd, us.end * qd}};
        if (qkv) {
          pieces.emplace_back(q_rows + us.begin * d, q_rows + us.end * d);
          pieces.emplace_back(q_rows + kv_rows + us.begin * d, q_rows + kv_rows + us.end * d);
        }
        for (size_t j = 0; j < pieces.size(); ++j) {
          const auto [begin, end] = pieces[j];
          bool found = false;
          for (const PlacementRun& r : split->runs) {
            if (begin >= r.global && end <= r.global + r.length) {
              const int64_t id = id_base + ((n_layer - 1 - l) * n + s) * per_block + position +
                                 static_cast<int64_t>(j);
              out.push_back(
                  {id, i, split->dim, r.local + (begin - r.global), end - begin, us.holders});
              found = true;
              break;
            }
          }
          LOOM_CHECK(found, "SDP heads: attention parameter '", name, "' does not hold [", begin,
                     ", ", end, ") of slice ", s, " (kv groups [", us.begin, ", ", us.end,
                     ")) of block ", l, " that worker ", worker,
                     held ? " holds" : " keeps a frozen copy of");
        }
      }
      position += pieces_of(params[i].second);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const SdpSliceSpec& a, const SdpSliceSpec& b) { return a.id < b.id; });
  return out;
}

}  // namespace loom::parallel::sdp
