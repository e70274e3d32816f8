// parallel/sdp/publish.cpp — SlicePublisher: the collective check of the slice lists (digest,
// then the lists on a mismatch), the message plan and its staging (Notes [SDP publication] and
// [SDP publication staging]), and publish(): pack, one send/recv group, unpack.
#include "parallel/sdp/publish.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/ops/view.h"

namespace loom::parallel::sdp {

namespace {

constexpr int kNumDTypes = static_cast<int>(DType::kU32) + 1;

std::string set_str(const std::vector<int>& holders) {
  std::string s = "{";
  for (size_t i = 0; i < holders.size(); ++i) {
    if (i > 0) s += ",";
    s += std::to_string(holders[i]);
  }
  s += "}";
  return s;
}

// One slice as a worker states it (what the construction compares across ranks).
struct Record {
  int64_t id = 0;
  int64_t dtype = 0;
  Shape shape;
  std::vector<int> holders;
  bool operator==(const Record&) const = default;
};

std::string record_str(const Record& r) {
  std::string shape;
  for (int64_t d : r.shape) {
    if (!shape.empty()) shape += "x";
    shape += std::to_string(d);
  }
  const bool known = r.dtype >= 0 && r.dtype < kNumDTypes;
  return detail::str("shape (", shape, "), dtype ",
                     known ? dtype_name(static_cast<DType>(r.dtype)) : "?", ", holders ",
                     set_str(r.holders));
}

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
    const std::vector<int>& h = s.holders;
    const bool sorted =
        std::adjacent_find(h.begin(), h.end(), std::greater_equal<int>()) == h.end();
    if (h.empty() || !sorted || h.front() < 0 || h.back() >= size) {
      return which + "holders " + set_str(h) + " must be ascending distinct ranks in [0, " +
             std::to_string(size) + "), at least one";
    }
  }
  return "";
}

// [id, dtype, ndim, dims…, k, holders…] per slice.
std::vector<int64_t> encode(const std::vector<PublishedSlice>& slices) {
  std::vector<int64_t> out;
  for (const PublishedSlice& s : slices) {
    out.push_back(s.id);
    out.push_back(static_cast<int64_t>(s.values.dtype()));
    out.push_back(s.values.dim());
    for (int64_t d : s.values.shape()) out.push_back(d);
    out.push_back(static_cast<int64_t>(s.holders.size()));
    for (int h : s.holders) out.push_back(h);
  }
  return out;
}

std::vector<Record> decode(const int64_t* p, int64_t n) {
  std::vector<Record> out;
  int64_t i = 0;
  while (i < n) {
    Record r;
    r.id = p[i++];
    r.dtype = p[i++];
    const int64_t ndim = p[i++];
    r.shape.assign(p + i, p + i + ndim);
    i += ndim;
    const int64_t k = p[i++];
    for (int64_t j = 0; j < k; ++j) r.holders.push_back(static_cast<int>(p[i++]));
    out.push_back(std::move(r));
  }
  return out;
}

// FNV-1a over the words' bytes.
int64_t digest(const std::vector<int64_t>& words) {
  uint64_t h = 1469598103934665603ULL;
  for (int64_t w : words) {
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<uint64_t>(w) >> (8 * b)) & 0xffu;
      h *= 1099511628211ULL;
    }
  }
  return static_cast<int64_t>(h);
}

// The first slice (ascending id) on which some rank disagrees with rank 0, as an error message.
// The same data on every rank, so every rank throws the same message.
std::string first_difference(const std::vector<std::vector<Record>>& all) {
  std::set<int64_t> ids;
  std::vector<std::map<int64_t, const Record*>> by_rank(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    for (const Record& rec : all[r]) {
      ids.insert(rec.id);
      by_rank[r].emplace(rec.id, &rec);
    }
  }
  for (int64_t id : ids) {
    const auto zero = by_rank[0].find(id);
    for (size_t r = 1; r < all.size(); ++r) {
      const auto other = by_rank[r].find(id);
      const bool in0 = zero != by_rank[0].end(), in_r = other != by_rank[r].end();
      if (in0 && in_r && *zero->second == *other->second) continue;
      if (in0 && in_r) {
        return detail::str("slice ", id, " is stated differently by rank 0 (",
                           record_str(*zero->second), ") and rank ", r, " (",
                           record_str(*other->second), ")");
      }
      if (in0) {
        return detail::str("slice ", id, " is listed by rank 0 (", record_str(*zero->second),
                           ") but not by rank ", r, " (every worker lists every slice)");
      }
      if (in_r) {
        return detail::str("slice ", id, " is listed by rank ", r, " (", record_str(*other->second),
                           ") but not by rank 0 (every worker lists every slice)");
      }
    }
  }
  return "the slice lists differ between ranks";  // unreachable: equal lists hash alike
}

// Throws, on every rank alike, unless every rank states the same valid list.
void check_lists(Communicator& group, const std::vector<PublishedSlice>& slices) {
  const int n = group.size();
  const std::string where = "SlicePublisher on group " + group.name() + ": ";
  const std::string problem = local_problem(slices, group.rank(), n);
  const std::vector<int64_t> mine = problem.empty() ? encode(slices) : std::vector<int64_t>{};
  Tensor head = Tensor::from_vector<int64_t>(
      {problem.empty() ? 0 : 1, static_cast<int64_t>(mine.size()), digest(mine)}, {3});
  Tensor heads = Tensor::empty({3 * n}, DType::kI64);
  group.all_gather(head, heads);
  LOOM_CHECK(problem.empty(), where, problem);
  const int64_t* h = heads.data<int64_t>();
  bool same = true;
  int64_t longest = 1;
  for (int r = 0; r < n; ++r) {
    LOOM_CHECK(h[3 * r] == 0, where, "rank ", r, "'s slice list is invalid (its error says why)");
    same = same && h[3 * r + 1] == h[1] && h[3 * r + 2] == h[2];
    longest = std::max(longest, h[3 * r + 1]);
  }
  if (same) return;
  Tensor body = Tensor::full({longest}, -1, DType::kI64);
  std::copy(mine.begin(), mine.end(), body.data<int64_t>());
  Tensor bodies = Tensor::empty({longest * n}, DType::kI64);
  group.all_gather(body, bodies);
  std::vector<std::vector<Record>> all;
  for (int r = 0; r < n; ++r)
    all.push_back(decode(bodies.data<int64_t>() + r * longest, h[3 * r + 1]));
  LOOM_FAIL(where, first_difference(all));
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
        region.pieces.push_back({size, slices[i].values});
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
    for (const Piece& piece : region.pieces) {
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
    for (Piece& piece : region.pieces) {
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
