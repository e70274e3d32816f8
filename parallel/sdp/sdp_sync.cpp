// parallel/sdp/sdp_sync.cpp — SDP's slices, the sync overlapped with backward, the global norm
// and the publication (see the header, Notes [SDP gradient slices], [SDP overlapped sync],
// [SDP replicas], [SDP publication]).
#include "parallel/sdp/sdp_sync.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/view.h"
#include "kernels/copy.h"
#include "parallel/sdp/head_slices.h"
#include "parallel/sdp/neuron_masking.h"

namespace loom::parallel::sdp {

std::vector<SdpSliceSpec> sdp_slices(const NeuronAssignment& cover, int worker,
                                     const std::vector<std::pair<std::string, Tensor>>& params,
                                     bool held) {
  const int64_t n_layer = static_cast<int64_t>(cover.layers.size());
  std::vector<int> all(static_cast<size_t>(cover.workers));
  std::iota(all.begin(), all.end(), 0);
  // Every rank lists the same parameters, so (block, position among the block's packed
  // parameters) and the replicated parameters' order are the same everywhere: the ids are
  // global (Note [SDP gradient slices]).
  std::vector<int64_t> position(params.size(), -1);
  std::vector<int64_t> per_block(static_cast<size_t>(n_layer), 0);
  int64_t packed_per_block = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].second.placement().split_over(kAxisSdp) == nullptr) continue;
    if (is_packed_head_parameter(params[i].second)) continue;  // head_slices' (heads option)
    const int64_t l = block_of(params[i].second.role());
    LOOM_CHECK(l >= 0 && l < n_layer, "SDP: packed parameter '", params[i].first,
               "' is not in a block of the cover (", n_layer, " layers)");
    position[i] = per_block[static_cast<size_t>(l)]++;
    packed_per_block = std::max(packed_per_block, position[i] + 1);
  }
  const int64_t n = cover.workers;
  std::vector<SdpSliceSpec> out;
  int64_t next_replicated = n_layer * n * packed_per_block;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    const Placement placement = p.placement();
    const PlacementSplit* split = placement.split_over(kAxisSdp);
    if (split == nullptr) {
      out.push_back({next_replicated++, i, 0, 0, -1, all});
      continue;
    }
    if (is_packed_head_parameter(p)) continue;  // the heads option's: head_slices lists them
    const int64_t l = block_of(p.role());
    const LayerCover& layer = cover.layers[static_cast<size_t>(l)];
    for (int s = 0; s < static_cast<int>(layer.slices.size()); ++s) {
      const UnitSlice& us = layer.slices[static_cast<size_t>(s)];
      if (us.size() == 0 || layer.holds(worker, s) != held) continue;
      bool found = false;
      for (const PlacementRun& r : split->runs) {
        if (us.begin >= r.global && us.end <= r.global + r.length) {
          const int64_t id = ((n_layer - 1 - l) * n + s) * packed_per_block + position[i];
          out.push_back(
              {id, i, split->dim, r.local + (us.begin - r.global), us.size(), us.holders});
          found = true;
          break;
        }
      }
      LOOM_CHECK(found, "SDP: packed parameter '", name, "' does not hold slice ", s, " [",
                 us.begin, ", ", us.end, ") of block ", l, " that worker ", worker,
                 held ? " holds" : " keeps a frozen copy of");
    }
  }
  std::sort(out.begin(), out.end(),
            [](const SdpSliceSpec& a, const SdpSliceSpec& b) { return a.id < b.id; });
  return out;
}

namespace {

Tensor slice_view(const Tensor& full, const SdpSliceSpec& s) {
  return s.length < 0 ? full : ops::narrow(full, s.dim, s.local_begin, s.length);
}

}  // namespace

// Note [SDP slice ids with heads]: with the heads option a block has MLP slices (sdp_slices: id
// ((L − 1 − l)·N + s)·P + p, P packed MLP parameters per block, then the replicated ones from
// L·N·P) and attention slices (head_slices from base 0: ((L − 1 − l)·N + s)·H + h, H pieces per
// block). Both are renumbered block-major so each block's attention follows its MLP, as backward
// produces them: with B = N·(P + H) per block, an MLP id becomes b·B + s·P + p, an attention id
// b·B + N·P + s·H + h (b = L − 1 − l), a replicated one L·B + its index. The formulas use only
// N, L, P, H (the same on every worker), so every worker renumbers alike. Under backward
// masking the frozen copies' slices (sdp_slices and head_slices with held = false, the holders'
// ids) are renumbered by the same formulas, with P and H of the trained parameters, so a frozen
// slice keeps its holders' id (the publication's).
namespace {

// Renumbers `slices` (sdp_slices of `listed`) and adds head_slices of `listed` (held or not):
// `listed` is `params` (held) or the frozen copies; P and H come from `params`.
void merge_head_slices(std::vector<SdpSliceSpec>& slices, const NeuronAssignment& heads, int worker,
                       const std::vector<std::pair<std::string, Tensor>>& params,
                       const std::vector<std::pair<std::string, Tensor>>& listed, bool held) {
  const int64_t n = heads.workers, layers = static_cast<int64_t>(heads.layers.size());
  const int64_t h = head_slice_id_span(heads, params) / std::max<int64_t>(n * layers, 1);
  int64_t p = 0;  // packed MLP parameters per block, as sdp_slices counts them
  for (const auto& [name, t] : params) {
    if (t.placement().split_over(kAxisSdp) != nullptr && !is_packed_head_parameter(t) &&
        block_of(t.role()) == 0)
      ++p;
  }
  const int64_t per_block = n * (p + h), mlp_ids = layers * n * p;
  for (SdpSliceSpec& x : slices) {
    if (x.id >= mlp_ids) {
      x.id = layers * per_block + (x.id - mlp_ids);
    } else {
      const int64_t b = x.id / (n * p), rest = x.id % (n * p);
      x.id = b * per_block + rest;
    }
  }
  for (SdpSliceSpec x : head_slices(heads, worker, listed, 0, held)) {
    const int64_t b = x.id / (n * h), rest = x.id % (n * h);
    x.id = b * per_block + n * p + rest;
    slices.push_back(std::move(x));
  }
  std::sort(slices.begin(), slices.end(),
            [](const SdpSliceSpec& a, const SdpSliceSpec& b) { return a.id < b.id; });
}

}  // namespace

SdpSetup neuron_setup(const NeuronAssignment& cover, int worker,
                      const std::vector<std::pair<std::string, Tensor>>& params,
                      std::vector<std::pair<std::string, Tensor>> frozen, bool forward_masking,
                      const NeuronAssignment* heads) {
  SdpSetup s;
  s.what = std::string(forward_masking ? "forward" : "backward") + " masking, neuron level";
  s.publishes = !forward_masking;
  s.workers = cover.workers;
  s.replication = cover.replication;
  s.coverage = cover.coverage;
  s.slices = sdp_slices(cover, worker, params, true);
  s.frozen_slices = sdp_slices(cover, worker, frozen, false);
  s.frozen = std::move(frozen);
  if (heads != nullptr) {
    merge_head_slices(s.slices, *heads, worker, params, params, true);
    merge_head_slices(s.frozen_slices, *heads, worker, params, s.frozen, false);
  }
  return s;
}

SdpSync::SdpSync(Communicator& dp, SdpSetup setup,
                 std::vector<std::pair<std::string, Tensor>> params, SliceSyncOptions options,
                 int micro_batches)
    : dp_(dp),
      setup_(std::move(setup)),
      worker_(dp.rank() % std::max(setup_.workers, 1)),
      replica_(dp.rank() / std::max(setup_.workers, 1)),
      params_(std::move(params)),
      micro_batches_(micro_batches),
      link_(std::make_shared<HookLink>()) {
  const int n = setup_.workers;
  LOOM_CONFIG_CHECK(n >= 1 && dp.size() % n == 0, "parallel.sdp.workers: the dp group's ",
                    dp.size(), " ranks are not a multiple of the ", n, " SDP workers");
  LOOM_CHECK(micro_batches >= 1, "SDP: micro_batches must be at least 1, got ", micro_batches);
  for (const auto& [name, p] : params_) buffers_.push_back(Tensor::zeros_like(p));
  slice_ids_.resize(params_.size());
  fired_.assign(params_.size(), 0);
  // The publication's group first (every rank makes its copy's, over its members only), then
  // the holder sets: one global order of creations on every rank.
  const bool publishes = setup_.publishes;
  Communicator* group = &dp;
  if (publishes && dp.size() > n) {
    std::vector<int> members(static_cast<size_t>(n));
    std::iota(members.begin(), members.end(), replica_ * n);
    const HolderGroupFactory make =
        options.make_group ? options.make_group : holder_group_factory(dp, options.timeout_s);
    // The factory's creation tag is 0x5d0 + index mod 4096; SliceSync numbers its holder sets
    // from 0, so the last index keeps this group's messages apart from theirs.
    constexpr int kCopyGroupIndex = 4095;
    group_ = make(members, "sdp_copy" + std::to_string(replica_), kCopyGroupIndex);
    group = group_.get();
  }
  std::vector<HeldSlice> held;
  for (const SdpSliceSpec& s : setup_.slices) {
    LOOM_CHECK(s.param < params_.size(), "SDP: slice ", s.id, " names parameter ", s.param, " of ",
               params_.size());
    held.push_back({s.id, dp_ranks(s.holders), slice_view(buffers_[s.param], s)});
    slice_ids_[s.param].push_back(s.id);  // slices are in ascending id
  }
  sync_ = std::make_unique<SliceSync>(dp, std::move(held), std::move(options));
  if (publishes) {
    std::vector<PublishedSlice> all;
    for (const SdpSliceSpec& s : setup_.slices) {
      if (s.holders.size() < static_cast<size_t>(n))  // a replicated one every worker trains
        all.push_back({s.id, s.holders, slice_view(params_[s.param].second, s)});
    }
    for (const SdpSliceSpec& s : setup_.frozen_slices)
      all.push_back({s.id, s.holders, slice_view(setup_.frozen[s.param].second, s)});
    std::sort(all.begin(), all.end(),
              [](const PublishedSlice& a, const PublishedSlice& b) { return a.id < b.id; });
    publisher_ = std::make_unique<SlicePublisher>(*group, std::move(all));
  }
  link_->owner = this;
  for (size_t i = 0; i < params_.size(); ++i) {
    std::shared_ptr<HookLink> link = link_;
    params_[i].second.register_grad_ready_hook([link, i](Tensor& leaf) {
      if (link->owner != nullptr) link->owner->on_grad_ready(i, leaf);
    });
  }
}

std::vector<int> SdpSync::dp_ranks(const std::vector<int>& workers) const {
  const int n = setup_.workers, copies = dp_.size() / n;
  std::vector<int> out;
  for (int r = 0; r < copies; ++r)
    for (int w : workers) out.push_back(r * n + w);
  return out;  // ascending: workers are ascending within [0, n)
}

bool SdpSync::counts(const SdpSliceSpec& s) const {
  return replica_ == 0 && !s.holders.empty() && s.holders.front() == worker_;
}

void SdpSync::publish() {
  if (publisher_) publisher_->publish();
}

SdpSync::~SdpSync() { link_->owner = nullptr; }

void SdpSync::zero_grad() {
  for (size_t i = 0; i < params_.size(); ++i) {
    kernels::call_kernel<kernels::fill_k>(buffers_[i], 0.0);  // in place, as GradBuckets does
    params_[i].second.set_grad(buffers_[i]);
  }
  std::fill(fired_.begin(), fired_.end(), 0);
  events_.clear();
}

void SdpSync::adopt(size_t index) {
  Tensor p = params_[index].second;
  Tensor& buf = buffers_[index];
  const Tensor g = p.grad();
  if (!g.defined()) {  // no gradient this step (unused): zeros, so the average is defined
    kernels::call_kernel<kernels::fill_k>(buf, 0.0);
  } else if (!(g.storage() == buf.storage() && g.offset() == buf.offset())) {
    ops::copy_(buf, g);  // .grad was cleared behind our back: AccumulateGrad made a fresh one
  }
  p.set_grad(buf);
}

void SdpSync::on_grad_ready(size_t index, Tensor& /*leaf*/) {
  events_.push_back({SdpEvent::Kind::kHook, -1, index});
  const int fired = ++fired_[index];
  LOOM_CHECK(fired <= micro_batches_, "SDP: gradient of '", params_[index].first, "' arrived ",
             fired, " times in a step of ", micro_batches_,
             " micro-batches; call finish() (the engine's finish) and zero_grad() before another "
             "backward");
  adopt(index);
  if (fired < micro_batches_) return;
  for (int64_t id : slice_ids_[index]) {
    events_.push_back({SdpEvent::Kind::kLaunch, id, index});
    sync_->launch(id);
  }
}

void SdpSync::finish() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (fired_[i] < micro_batches_) adopt(i);
  sync_->finish();
  std::fill(fired_.begin(), fired_.end(), 0);
}

void SdpSync::set_micro_batches(int micro_batches) {
  LOOM_CHECK(micro_batches >= 1, "SDP: micro_batches must be at least 1, got ", micro_batches);
  LOOM_CHECK(std::all_of(fired_.begin(), fired_.end(), [](int f) { return f == 0; }),
             "SDP: set_micro_batches inside a step (after a backward, before finish())");
  micro_batches_ = micro_batches;
}

std::string SdpSync::describe() const {
  std::ostringstream os;
  int64_t split = 0;
  for (const SdpSliceSpec& s : setup_.slices)
    if (s.length >= 0 || s.holders.size() < static_cast<size_t>(setup_.workers)) ++split;
  os << "sdp: " << setup_.what << ", " << setup_.workers << " workers";
  if (dp_.size() > setup_.workers)
    os << " × " << dp_.size() / setup_.workers << " data-parallel copies";
  os << ", coverage " << setup_.coverage << " (" << setup_.replication << " holders per slice); "
     << split << " split slices and " << setup_.slices.size() - static_cast<size_t>(split)
     << " replicated parameters averaged from the gradient hooks, overlapped with backward";
  if (publisher_) os << "; " << publisher_->describe();
  return os.str();
}

}  // namespace loom::parallel::sdp
