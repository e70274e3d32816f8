// parallel/sdp/slice_list.h — the slice lists that SDP's collective constructions (SliceSync,
// SlicePublisher) compare across the ranks of a group: one record per slice (id, dtype, shape,
// holders), their encoding as int64 words for an all-gather ([id, dtype, ndim, dims…, k,
// holders…] per slice, ascending id), and the two gathers built on it: every rank's list, or
// only the verdict that every rank states the same list. A rank whose list is unusable on its
// own (its caller says why) makes every rank throw, so a bad list is never a hang.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::sdp {

// One slice as a worker states it (what the ranks compare).
struct SliceRecord {
  int64_t id = 0;
  int64_t dtype = 0;
  Shape shape;
  std::vector<int> holders;
  bool operator==(const SliceRecord&) const = default;
};

// The record of a slice whose tensor (values or gradient) is `t`; `t` must be defined.
SliceRecord slice_record(int64_t id, const Tensor& t, const std::vector<int>& holders);

// "{0,2}".
std::string set_str(const std::vector<int>& holders);
// "shape (3x4), dtype f32, holders {0,1}" (dtype "?" for an index that names none).
std::string record_str(const SliceRecord& r);

// Whether `holders` are ascending distinct ranks in [0, size), at least one.
bool holders_valid(const std::vector<int>& holders, int size);

// [id, dtype, ndim, dims…, k, holders…] per record, and back (n words from p).
std::vector<int64_t> encode_records(const std::vector<SliceRecord>& records);
std::vector<SliceRecord> decode_records(const int64_t* p, int64_t n);

// Collective over `group`: every rank's records (index: rank), all-gathered. `problem` is why
// this rank's list is unusable on its own, or "" (then `mine` is its list, ascending id); when
// some rank has one, every rank throws: that rank `where` + its problem, the others `where` +
// "rank r's slice list is invalid (its error says why)".
std::vector<std::vector<SliceRecord>> gather_slice_lists(Communicator& group,
                                                         const std::string& where,
                                                         const std::string& problem,
                                                         const std::vector<SliceRecord>& mine);

// Collective over `group`, as gather_slice_lists, but only each list's length and digest are
// all-gathered unless they differ; then the lists are, and every rank throws `where` + the first
// slice (ascending id) on which some rank disagrees with rank 0 — stated differently, or listed
// by one and not the other (every worker lists every slice).
void check_same_slice_lists(Communicator& group, const std::string& where,
                            const std::string& problem, const std::vector<SliceRecord>& mine);

}  // namespace loom::parallel::sdp
