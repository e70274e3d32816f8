// parallel/sdp/slice_sync.cpp — SliceSync: the collective check of the slice lists and the
// holder groups' creation (Note [SDP holder groups]), the buckets and their in-order issue
// (Note [SDP bucket order]), and the default holder-group factory over MPI. The reductions
// themselves are the communicators' (parallel/comm/).
#include "parallel/sdp/slice_sync.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/ops/view.h"
#include "parallel/sdp/slice_list.h"

namespace loom::parallel::sdp {

struct SliceSync::Slice {
  int64_t id = 0;
  Tensor grad;
  int set = -1;  // index in sets_; -1: held by this worker alone
  int bucket = -1;
  int64_t offset = 0;  // in the bucket's flat buffer
  bool launched = false;
};

struct SliceSync::Bucket {
  DType dtype = DType::kF32;
  Device device;
  int64_t numel = 0;
  Tensor flat;  // (numel) the set's slices in ascending id
  int slices = 0;
  int pending = 0;  // slices not launched yet in this step
  WorkPtr work;     // the all-reduce in flight, once issued
};

struct SliceSync::HolderSet {
  std::vector<int> holders;
  std::unique_ptr<Communicator> comm;
  std::vector<int> buckets;  // indices in buckets_, in issue order
  size_t next = 0;           // the first bucket not issued yet in this step
};

namespace {

// Why this rank's list is unusable, or "" (checked before anything is gathered).
std::string local_problem(const std::vector<HeldSlice>& slices, int rank, int size) {
  std::set<int64_t> ids;
  for (const HeldSlice& s : slices) {
    const std::string which = detail::str("slice ", s.id, " on rank ", rank, ": ");
    if (!ids.insert(s.id).second) return which + "listed twice";
    if (!s.grad.defined()) return which + "its gradient tensor is undefined";
    if (!is_floating(s.grad.dtype())) {
      return which + "its gradient is " + dtype_name(s.grad.dtype()) +
             "; averaging needs a floating dtype";
    }
    const std::vector<int>& h = s.holders;
    if (!holders_valid(h, size)) {
      return which + "holders " + set_str(h) + " must be ascending distinct dp ranks in [0, " +
             std::to_string(size) + ")";
    }
    if (!std::binary_search(h.begin(), h.end(), rank)) {
      return which + "holders " + set_str(h) + " do not include this rank";
    }
  }
  return "";
}

// Every rank's records, gathered over dp; throws the same error on every rank when some rank's
// list failed its local check.
std::vector<std::vector<SliceRecord>> gather_records(Communicator& dp,
                                                     const std::vector<HeldSlice>& slices) {
  const std::string problem = local_problem(slices, dp.rank(), dp.size());
  std::vector<SliceRecord> mine;
  if (problem.empty()) {
    for (const HeldSlice& s : slices) mine.push_back(slice_record(s.id, s.grad, s.holders));
  }
  return gather_slice_lists(dp, "SliceSync on group " + dp.name() + ": ", problem, mine);
}

// Every slice stated alike by all its holders and by them only. The same data on every rank,
// so every rank reaches the same verdict. Returns every holder set of two or more, sorted.
std::vector<std::vector<int>> check_records(const std::vector<std::vector<SliceRecord>>& all,
                                            const std::string& group) {
  std::map<int64_t, std::pair<const SliceRecord*, std::vector<int>>> by_id;  // record, listers
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    for (const SliceRecord& rec : all[static_cast<size_t>(r)]) {
      auto [it, fresh] = by_id.try_emplace(rec.id, &rec, std::vector<int>{});
      const SliceRecord& first = *it->second.first;
      LOOM_CHECK(fresh || rec == first, "SliceSync on group ", group, ": slice ", rec.id,
                 " is stated differently by rank ", it->second.second.front(), " (",
                 record_str(first), ") and rank ", r, " (", record_str(rec), ")");
      it->second.second.push_back(r);
    }
  }
  std::set<std::vector<int>> sets;
  for (const auto& [id, entry] : by_id) {
    const std::vector<int>& holders = entry.first->holders;
    LOOM_CHECK(entry.second == holders, "SliceSync on group ", group, ": slice ", id,
               " has holders ", set_str(holders), " but is listed by ranks ",
               set_str(entry.second));
    if (holders.size() > 1) sets.insert(holders);
  }
  return {sets.begin(), sets.end()};
}

}  // namespace

std::string holder_group_name(const std::vector<int>& holders) { return "sdp" + set_str(holders); }

HolderGroupFactory holder_group_factory(Communicator& dp, double timeout_s) {
  constexpr int kCreateTag = 0x5d0;  // MPI_Comm_create_group's tags: kCreateTag + set index
  return [&dp, timeout_s](const std::vector<int>& members, const std::string& name, int index) {
    const int tag = kCreateTag + index % 4096;          // within MPI's guaranteed tag range (32767)
    return dp.subgroup(members, name, timeout_s, tag);  // refused by a backend without them
  };
}

SliceSync::SliceSync(Communicator& dp, std::vector<HeldSlice> slices, SliceSyncOptions options) {
  std::sort(slices.begin(), slices.end(),
            [](const HeldSlice& a, const HeldSlice& b) { return a.id < b.id; });
  const std::vector<std::vector<int>> all_sets =
      check_records(gather_records(dp, slices), dp.name());
  const double timeout = options.timeout_s > 0 ? options.timeout_s : default_comm_timeout_s();
  HolderGroupFactory make =
      options.make_group ? options.make_group : holder_group_factory(dp, timeout);
  // This worker's sets, created in the global order (Note [SDP holder groups]).
  std::map<std::vector<int>, int> set_of;
  for (size_t i = 0; i < all_sets.size(); ++i) {
    if (!std::binary_search(all_sets[i].begin(), all_sets[i].end(), dp.rank())) continue;
    HolderSet set;
    set.holders = all_sets[i];
    const std::string name = holder_group_name(set.holders);
    set.comm = make(set.holders, name, static_cast<int>(i));
    LOOM_CHECK(set.comm && set.comm->size() == static_cast<int>(set.holders.size()),
               "SliceSync: the factory's communicator for ", name, " has the wrong size");
    set_of.emplace(set.holders, static_cast<int>(sets_.size()));
    sets_.push_back(std::move(set));
  }
  for (HeldSlice& s : slices) {
    Slice slice{s.id, std::move(s.grad)};
    if (s.holders.size() > 1) place(slice, set_of.at(s.holders), options.bucket_bytes);
    slices_.push_back(std::move(slice));
  }
  for (Bucket& bucket : buckets_) {
    bucket.flat = Tensor::zeros({bucket.numel}, bucket.dtype, bucket.device);
    bucket.pending = bucket.slices;
  }
}

// Appends the slice to its set's last bucket, or opens a new one (Note [SDP bucket order]).
void SliceSync::place(Slice& slice, int set_index, size_t bucket_bytes) {
  HolderSet& set = sets_[static_cast<size_t>(set_index)];
  const Tensor& g = slice.grad;
  bool fresh = set.buckets.empty();
  if (!fresh) {
    const Bucket& last = buckets_[static_cast<size_t>(set.buckets.back())];
    const size_t bytes = static_cast<size_t>(last.numel + g.numel()) * dtype_size(g.dtype());
    fresh = last.dtype != g.dtype() || last.device != g.device() || bytes > bucket_bytes;
  }
  if (fresh) {
    set.buckets.push_back(static_cast<int>(buckets_.size()));
    buckets_.emplace_back();
    buckets_.back().dtype = g.dtype();
    buckets_.back().device = g.device();
  }
  Bucket& bucket = buckets_[static_cast<size_t>(set.buckets.back())];
  slice.set = set_index;
  slice.bucket = set.buckets.back();
  slice.offset = bucket.numel;
  bucket.numel += g.numel();
  ++bucket.slices;
}

SliceSync::~SliceSync() = default;

void SliceSync::launch(int64_t slice_id) {
  auto it = std::lower_bound(slices_.begin(), slices_.end(), slice_id,
                             [](const Slice& s, int64_t id) { return s.id < id; });
  LOOM_CHECK(it != slices_.end() && it->id == slice_id, "SliceSync::launch: slice ", slice_id,
             " is not held by this worker");
  LOOM_CHECK(!it->launched, "SliceSync::launch: slice ", slice_id,
             " was launched twice in one step (finish() ends a step)");
  it->launched = true;
  if (it->set < 0) return;
  Bucket& bucket = buckets_[static_cast<size_t>(it->bucket)];
  Tensor dst = bucket.flat.narrow(0, it->offset, it->grad.numel()).view(it->grad.shape());
  ops::copy_(dst, it->grad);
  if (--bucket.pending == 0) issue_ready(sets_[static_cast<size_t>(it->set)]);
}

void SliceSync::issue_ready(HolderSet& set) {
  while (set.next < set.buckets.size()) {
    Bucket& bucket = buckets_[static_cast<size_t>(set.buckets[set.next])];
    if (bucket.pending > 0) return;
    bucket.work = set.comm->all_reduce_async(bucket.flat, ReduceOp::kAvg);
    ++set.next;
  }
}

void SliceSync::finish() {
  for (Slice& s : slices_) {
    if (!s.launched) launch(s.id);
  }
  for (HolderSet& set : sets_) {
    for (int b : set.buckets) {
      Bucket& bucket = buckets_[static_cast<size_t>(b)];
      LOOM_CHECK(bucket.work != nullptr, "SliceSync::finish: a bucket of ", set.comm->name(),
                 " was never issued");
      bucket.work->wait();
    }
  }
  for (Slice& s : slices_) {
    s.launched = false;
    if (s.set < 0) continue;
    const Bucket& bucket = buckets_[static_cast<size_t>(s.bucket)];
    ops::copy_(s.grad, bucket.flat.narrow(0, s.offset, s.grad.numel()).view(s.grad.shape()));
  }
  for (Bucket& bucket : buckets_) {
    bucket.pending = bucket.slices;
    bucket.work = nullptr;
  }
  for (HolderSet& set : sets_) set.next = 0;
}

std::vector<std::vector<int>> SliceSync::holder_sets() const {
  std::vector<std::vector<int>> out;
  for (const HolderSet& set : sets_) out.push_back(set.holders);
  return out;
}

Communicator& SliceSync::group(const std::vector<int>& holders) const {
  for (const HolderSet& set : sets_) {
    if (set.holders == holders) return *set.comm;
  }
  LOOM_FAIL("SliceSync: this worker has no holder group ", holder_group_name(holders));
}

int SliceSync::num_buckets() const { return static_cast<int>(buckets_.size()); }

}  // namespace loom::parallel::sdp
