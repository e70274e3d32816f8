// parallel/sdp/publish.cpp — SlicePublisher: the collective check of the slice lists
// (check_same_slice_lists, parallel/sdp/slice_list.h), the message plan and its staging (Notes [SDP
// publication] and [SDP publication staging]), and publish(): pack, one send/recv group, unpack.
#include "parallel/sdp/publish.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/ops/view.h"
#include "parallel/sdp/slice_list.h"

namespace loom::parallel::sdp {

namespace {

constexpr int kNumDTypes = static_cast<int>(DType::kU32) + 1;

// Why this rank's list is unusable on its own, or "" (slices sorted by id).
std::string local_problem(const std::vector<PublishedSlice>& slices, int rank, int size) {
  for (size_t i = 0; i < slices.size(); ++i) {
    const PublishedSlice& s = slices[i];
    const std::string which = detail::str("slice ", s.id, " on rank ", rank, ": ");
    if (i > 0 && slices[i - 1].id == s.id) return which + "listed twice";
    if (!s.values.defined()) return which + "its values tensor is undefined";
    if (s.values.device() != slices.front().values.device()) {
      return detail::str(which, "its values are on ", device_type_name(s.values.device().type), ":",
                         s.values.device().index, ", slice ", slices.front().id, "'s on ",
                         device_type_name(slices.front().values.device().type), ":",
                         slices.front().values.device().index,
                         "; one worker's slices must share a device");
    }
    if (!holders_valid(s.holders, size)) {
      return which + "holders " + set_str(s.holders) + " must be ascending distinct ranks in [0, " +
             std::to_string(size) + "), at least one";
    }
  }
  return "";
}

// Throws, on every rank alike, unless every rank states the same valid list.
void check_lists(Communicator& group, const std::vector<PublishedSlice>& slices) {
  const std::string problem = local_problem(slices, group.rank(), group.size());
  std::vector<SliceRecord> mine;
  if (problem.empty()) {
    for (const PublishedSlice& s : slices) mine.push_back(slice_record(s.id, s.values, s.holders));
  }
  check_same_slice_lists(group, "SlicePublisher on group " + group.name() + ": ", problem, mine);
}

bool holds(const PublishedSlice& s, int rank) {
  return std::binary_search(s.holders.begin(), s.holders.end(), rank);
}

}  // namespace

int slice_publisher(int64_t id, const std::vector<int>& holders) {
  LOOM_CHECK(!holders.empty(), "slice ", id, " has no holder to publish it");
  const auto k = static_cast<int64_t>(holders.size());
  return holders[static_cast<size_t>(((id % k) + k) % k)];
}

SlicePublisher::SlicePublisher(Communicator& group, std::vector<PublishedSlice> slices)
    : group_(group) {
  std::sort(slices.begin(), slices.end(),
            [](const PublishedSlice& a, const PublishedSlice& b) { return a.id < b.id; });
  check_lists(group, slices);
  const int n = group.size(), me = group.rank();
  num_slices_ = static_cast<int64_t>(slices.size());
  for (const PublishedSlice& s : slices) num_held_ += holds(s, me) ? 1 : 0;

  // The regions as lists of slice indices (ascending id), then their places in the buffers.
  struct Spec {
    int dtype = 0;
    std::vector<size_t> slices;
  };
  std::vector<Spec> send_specs, recv_specs;
  std::map<std::pair<int, std::vector<size_t>>, int> send_region_of;  // shared lists
  auto list = [&](int publisher, int receiver, int dtype) {
    std::vector<size_t> out;
    for (size_t i = 0; i < slices.size(); ++i) {
      const PublishedSlice& s = slices[i];
      if (static_cast<int>(s.values.dtype()) == dtype && s.values.numel() > 0 &&
          !holds(s, receiver) && slice_publisher(s.id, s.holders) == publisher)
        out.push_back(i);
    }
    return out;
  };
  std::set<int> dtypes;  // present in the list
  for (const PublishedSlice& s : slices) dtypes.insert(static_cast<int>(s.values.dtype()));
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    for (int d : dtypes) {
      std::vector<size_t> ids = list(me, r, d);
      if (ids.empty()) continue;
      for (size_t i : ids) sent_ += slices[i].values.numel();
      auto [it, fresh] = send_region_of.try_emplace({d, ids}, static_cast<int>(send_specs.size()));
      if (fresh) send_specs.push_back({d, std::move(ids)});
      sends_.push_back({r, kPublishTag + d, it->second});
    }
  }
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    for (int d : dtypes) {
      std::vector<size_t> ids = list(p, me, d);
      if (ids.empty()) continue;
      for (size_t i : ids) received_ += slices[i].values.numel();
      recvs_.push_back({p, kPublishTag + d, static_cast<int>(recv_specs.size())});
      recv_specs.push_back({d, std::move(ids)});
    }
  }
  // One buffer per dtype and direction (Note [SDP publication staging]).
  const Device device = slices.empty() ? Device{} : slices.front().values.device();
  auto lay_out = [&](const std::vector<Spec>& specs, std::vector<Region>& regions) {
    std::vector<int64_t> total(kNumDTypes, 0), start(specs.size(), 0);
    for (size_t j = 0; j < specs.size(); ++j) {
      start[j] = total[static_cast<size_t>(specs[j].dtype)];
      for (size_t i : specs[j].slices)
        total[static_cast<size_t>(specs[j].dtype)] += slices[i].values.numel();
    }
    std::vector<Tensor> buffers(kNumDTypes);
    for (int d = 0; d < kNumDTypes; ++d) {
      if (total[static_cast<size_t>(d)] == 0) continue;
      buffers[static_cast<size_t>(d)] =
          Tensor::empty({total[static_cast<size_t>(d)]}, static_cast<DType>(d), device);
      staging_.push_back(buffers[static_cast<size_t>(d)]);
    }
    for (size_t j = 0; j < specs.size(); ++j) {
      Region region;
      int64_t size = 0;
      for (size_t i : specs[j].slices) {
        region.slices.push_back({size, slices[i].values});
        size += slices[i].values.numel();
      }
      region.flat = buffers[static_cast<size_t>(specs[j].dtype)].narrow(0, start[j], size);
      regions.push_back(std::move(region));
    }
  };
  lay_out(send_specs, pack_);
  lay_out(recv_specs, unpack_);
}

void SlicePublisher::publish() {
  for (Region& region : pack_) {
    for (const StagedSlice& piece : region.slices) {
      Tensor dst =
          region.flat.narrow(0, piece.offset, piece.values.numel()).view(piece.values.shape());
      ops::copy_(dst, piece.values);
    }
  }
  std::vector<P2P> transfers;
  for (const Message& m : sends_)
    transfers.push_back(P2P::send(pack_[static_cast<size_t>(m.region)].flat, m.peer, m.tag));
  for (const Message& m : recvs_)
    transfers.push_back(P2P::recv(unpack_[static_cast<size_t>(m.region)].flat, m.peer, m.tag));
  if (!transfers.empty()) {
    const std::vector<WorkPtr> works = group_.send_recv_async(std::move(transfers));
    const Work* last = nullptr;  // a backend may return one Work for the whole group
    for (const WorkPtr& w : works) {
      if (w.get() != last) w->wait();
      last = w.get();
    }
  }
  for (Region& region : unpack_) {
    for (StagedSlice& piece : region.slices) {
      ops::copy_(
          piece.values,
          region.flat.narrow(0, piece.offset, piece.values.numel()).view(piece.values.shape()));
    }
  }
}

int64_t SlicePublisher::staging_elements() const {
  int64_t n = 0;
  for (const Tensor& t : staging_) n += t.numel();
  return n;
}

std::string SlicePublisher::describe() const {
  return detail::str("SlicePublisher on group ", group_.name(), ": ", num_slices_, " slices (",
                     num_held_, " held here); per publish sends ", sends_.size(), " messages (",
                     sent_, " elements), receives ", recvs_.size(), " messages (", received_,
                     " elements); staging ", staging_elements(), " elements");
}

}  // namespace loom::parallel::sdp
