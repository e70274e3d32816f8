// parallel/sdp/slice_list.cpp — the slice lists' records, their int64 encoding, and the
// collective gathers that compare them across ranks (a head of {invalid, length, digest} per
// rank first, then the lists themselves when needed).
#include "parallel/sdp/slice_list.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "core/error.h"

namespace loom::parallel::sdp {

namespace {

constexpr int kNumDTypes = static_cast<int>(DType::kU32) + 1;

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

// Every rank's {invalid, length, digest} (3 words a rank); throws on every rank when some
// rank's list is invalid.
std::vector<int64_t> gather_heads(Communicator& group, const std::string& where,
                                  const std::string& problem, const std::vector<int64_t>& words) {
  const int n = group.size();
  Tensor head = Tensor::from_vector<int64_t>(
      {problem.empty() ? 0 : 1, static_cast<int64_t>(words.size()), digest(words)}, {3});
  Tensor heads = Tensor::empty({3 * n}, DType::kI64);
  group.all_gather(head, heads);
  LOOM_CHECK(problem.empty(), where, problem);
  const int64_t* h = heads.data<int64_t>();
  for (int r = 0; r < n; ++r) {
    LOOM_CHECK(h[3 * r] == 0, where, "rank ", r, "'s slice list is invalid (its error says why)");
  }
  return {h, h + 3 * n};
}

// Every rank's records, all-gathered padded to the longest list (heads from gather_heads).
std::vector<std::vector<SliceRecord>> gather_bodies(Communicator& group,
                                                    const std::vector<int64_t>& words,
                                                    const std::vector<int64_t>& heads) {
  const int n = group.size();
  int64_t longest = 1;
  for (int r = 0; r < n; ++r) longest = std::max(longest, heads[static_cast<size_t>(3 * r + 1)]);
  Tensor body = Tensor::full({longest}, -1, DType::kI64);
  std::copy(words.begin(), words.end(), body.data<int64_t>());
  Tensor bodies = Tensor::empty({longest * n}, DType::kI64);
  group.all_gather(body, bodies);
  std::vector<std::vector<SliceRecord>> out;
  for (int r = 0; r < n; ++r) {
    out.push_back(decode_records(bodies.data<int64_t>() + r * longest,
                                 heads[static_cast<size_t>(3 * r + 1)]));
  }
  return out;
}

// The first slice (ascending id) on which some rank disagrees with rank 0, as an error message.
// The same data on every rank, so every rank throws the same message.
std::string first_difference(const std::vector<std::vector<SliceRecord>>& all) {
  std::set<int64_t> ids;
  std::vector<std::map<int64_t, const SliceRecord*>> by_rank(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    for (const SliceRecord& rec : all[r]) {
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

}  // namespace

SliceRecord slice_record(int64_t id, const Tensor& t, const std::vector<int>& holders) {
  return {id, static_cast<int64_t>(t.dtype()), t.shape(), holders};
}

std::string set_str(const std::vector<int>& holders) {
  std::string s = "{";
  for (size_t i = 0; i < holders.size(); ++i) {
    if (i > 0) s += ",";
    s += std::to_string(holders[i]);
  }
  s += "}";
  return s;
}

std::string record_str(const SliceRecord& r) {
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

bool holders_valid(const std::vector<int>& h, int size) {
  const bool sorted = std::adjacent_find(h.begin(), h.end(), std::greater_equal<int>()) == h.end();
  return !h.empty() && sorted && h.front() >= 0 && h.back() < size;
}

std::vector<int64_t> encode_records(const std::vector<SliceRecord>& records) {
  std::vector<int64_t> out;
  for (const SliceRecord& r : records) {
    out.push_back(r.id);
    out.push_back(r.dtype);
    out.push_back(static_cast<int64_t>(r.shape.size()));
    for (int64_t d : r.shape) out.push_back(d);
    out.push_back(static_cast<int64_t>(r.holders.size()));
    for (int h : r.holders) out.push_back(h);
  }
  return out;
}

std::vector<SliceRecord> decode_records(const int64_t* p, int64_t n) {
  std::vector<SliceRecord> out;
  int64_t i = 0;
  while (i < n) {
    SliceRecord r;
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

std::vector<std::vector<SliceRecord>> gather_slice_lists(Communicator& group,
                                                         const std::string& where,
                                                         const std::string& problem,
                                                         const std::vector<SliceRecord>& mine) {
  const std::vector<int64_t> words =
      problem.empty() ? encode_records(mine) : std::vector<int64_t>{};
  return gather_bodies(group, words, gather_heads(group, where, problem, words));
}

void check_same_slice_lists(Communicator& group, const std::string& where,
                            const std::string& problem, const std::vector<SliceRecord>& mine) {
  const std::vector<int64_t> words =
      problem.empty() ? encode_records(mine) : std::vector<int64_t>{};
  const std::vector<int64_t> heads = gather_heads(group, where, problem, words);
  bool same = true;
  for (size_t r = 0; r < heads.size(); r += 3) {
    same = same && heads[r + 1] == heads[1] && heads[r + 2] == heads[2];
  }
  if (same) return;
  LOOM_FAIL(where, first_difference(gather_bodies(group, words, heads)));
}

}  // namespace loom::parallel::sdp
