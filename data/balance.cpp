// data/balance.cpp — Karmarkar–Karp k-way partitioning and first-fit-decreasing micro-batches
// (Note [Balanced partition] in data/balance.h).
#include "data/balance.h"

#include <algorithm>
#include <queue>

#include "core/error.h"

namespace loom {
namespace {

// A partial partition: k part sums (sorted descending) with the sequences of each part.
struct Tuple {
  std::vector<double> sums;
  std::vector<std::vector<int64_t>> members;
  int64_t first = 0;  // the smallest sequence index in it: the tie-break
  double spread() const { return sums.front() - sums.back(); }
};

struct LessSpread {  // a max-heap on spread, then the smaller first index
  bool operator()(const Tuple& a, const Tuple& b) const {
    if (a.spread() != b.spread()) return a.spread() < b.spread();
    return a.first > b.first;
  }
};

// Merges b into a: a's heaviest part with b's lightest, and so on; re-sorted descending.
Tuple merge(Tuple a, Tuple b) {
  const size_t k = a.sums.size();
  Tuple out;
  out.first = std::min(a.first, b.first);
  std::vector<std::pair<double, std::vector<int64_t>>> parts(k);
  for (size_t i = 0; i < k; ++i) {
    parts[i].first = a.sums[i] + b.sums[k - 1 - i];
    parts[i].second = std::move(a.members[i]);
    parts[i].second.insert(parts[i].second.end(), b.members[k - 1 - i].begin(),
                           b.members[k - 1 - i].end());
  }
  // Descending by sum; equal sums by their smallest member, so the order is deterministic.
  auto smallest = [](const std::vector<int64_t>& m) {
    return m.empty() ? INT64_MAX : *std::min_element(m.begin(), m.end());
  };
  std::stable_sort(parts.begin(), parts.end(), [&](const auto& x, const auto& y) {
    if (x.first != y.first) return x.first > y.first;
    return smallest(x.second) < smallest(y.second);
  });
  for (auto& [sum, members] : parts) {
    out.sums.push_back(sum);
    out.members.push_back(std::move(members));
  }
  return out;
}

}  // namespace

std::vector<std::vector<int64_t>> partition_balanced(const std::vector<int64_t>& lengths, int parts,
                                                     const SequenceCost& cost) {
  LOOM_CHECK(parts >= 1, "partition_balanced: parts must be >= 1, got ", parts);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(parts));
  if (lengths.empty()) return out;
  std::priority_queue<Tuple, std::vector<Tuple>, LessSpread> heap;
  for (size_t i = 0; i < lengths.size(); ++i) {
    LOOM_CHECK(lengths[i] >= 0, "partition_balanced: sequence ", i, " has length ", lengths[i]);
    Tuple t;
    t.sums.assign(static_cast<size_t>(parts), 0.0);
    t.members.resize(static_cast<size_t>(parts));
    t.sums[0] = cost(lengths[i]);
    t.members[0].push_back(static_cast<int64_t>(i));
    t.first = static_cast<int64_t>(i);
    heap.push(std::move(t));
  }
  while (heap.size() > 1) {
    Tuple a = heap.top();
    heap.pop();
    Tuple b = heap.top();
    heap.pop();
    heap.push(merge(std::move(a), std::move(b)));
  }
  Tuple last = heap.top();
  for (size_t p = 0; p < out.size(); ++p) {
    out[p] = std::move(last.members[p]);
    std::sort(out[p].begin(), out[p].end());
  }
  return out;
}

std::vector<std::vector<int64_t>> cut_microbatches(const std::vector<int64_t>& indices,
                                                   const std::vector<int64_t>& lengths,
                                                   int64_t max_tokens) {
  LOOM_CHECK(max_tokens > 0, "cut_microbatches: max_tokens must be positive, got ", max_tokens);
  std::vector<int64_t> order = indices;
  for (int64_t i : order) {
    LOOM_CHECK(i >= 0 && static_cast<size_t>(i) < lengths.size(), "cut_microbatches: index ", i,
               " outside ", lengths.size(), " sequences");
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    return lengths[static_cast<size_t>(x)] > lengths[static_cast<size_t>(y)];
  });
  std::vector<std::vector<int64_t>> batches;
  std::vector<int64_t> used;
  for (int64_t i : order) {
    const int64_t n = lengths[static_cast<size_t>(i)];
    size_t b = 0;
    while (b < batches.size() && used[b] + n > max_tokens) ++b;
    if (b == batches.size()) {
      batches.emplace_back();
      used.push_back(0);
    }
    batches[b].push_back(i);
    used[b] += n;
  }
  return batches;
}

}  // namespace loom
