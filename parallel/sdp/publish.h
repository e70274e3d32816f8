// parallel/sdp/publish.h — SlicePublisher: the publication of SDP backward masking (subnetwork
// data parallelism, arXiv 2507.09029; docs/parallel.md, "## SDP", decision 3). Under backward
// masking every worker runs the full forward, so it keeps a copy of every slice of the model:
// the slices it holds are trained (after the optimiser step their k holders agree bitwise), the
// others are a frozen copy that publish() refreshes after every step from one holder. It moves
// values only; which worker holds what is decided elsewhere (parallel/sdp/assignment.h).
//
// Note [SDP publication]: slice s (holders h_0 < … < h_{k-1}, ranks of the group) is published
// by h_{s mod k} (the non-negative residue), so a holder set's slices are spread over its
// members. For every ordered pair (publisher p, receiver r) such that p publishes a slice r
// does not hold, publish() sends ONE message per dtype: the concatenation of those slices in
// ascending id. Every message of a publish() is issued at once as one point-to-point group
// (Communicator::send_recv_async: sends to ascending receivers, then receives from ascending
// publishers, dtypes ascending within each; tag kPublishTag + dtype), then all are waited, then
// each received piece is copied into the receiver's view (any strides). Each worker thus
// receives exactly the elements of the slices it does not hold — (1 − C)·Ψ_s under a cover of
// coverage C — and sends, for each slice it publishes, its size times the N − k non-holders.
// A holder's copy is never written, also when it differs from the publisher's (publish() does
// not check that holders agree: that is the optimiser's job). Nothing is all-gathered: an
// all-gather padded to the largest share would also deliver every slice to its k − 1 other
// holders. The grouping as one send/recv group keeps it deadlock-free under NCCL's rules (Note
// [NCCL rules on MPI]). Slices of different dtypes are supported: each dtype has its own
// staging and its own message per pair (a pair whose slices share one dtype, the usual case,
// exchanges one message). All slices of one worker must be on one device.
//
// Note [SDP publication staging]: the staging buffers are allocated once, at construction, on
// the values' device. Receive: one region per (publisher, dtype), all regions together the size
// of the slices not held. Send: one region per distinct list of slices — two receivers missing
// exactly the same slices of this publisher share one region, packed once per publish() — so
// at most the published slices times the number of receivers with distinct lists. Packing
// (ops::copy_ from each view into its region) and unpacking (the reverse) run on the calling
// thread; the views must not be written while publish() runs.
//
// Construction is collective over the group and checks that every worker states the same
// slices: each rank's list (ascending id: id, dtype, shape, holders) is hashed and the
// (length, hash) pairs all-gathered; on any difference the lists themselves are gathered and
// every rank throws the same error naming the first differing slice and the two ranks, so a
// mismatched list is one error on every rank, never a hang. A list that is invalid on its own
// (an id twice, holders not ascending distinct ranks of the group, an undefined tensor, values
// on two devices) throws its own message on its rank and a pointer to that rank elsewhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::sdp {

// One slice of the model, as every worker of the group lists it.
struct PublishedSlice {
  int64_t id = 0;            // global: the same on every worker, each id once
  std::vector<int> holders;  // ranks of the group, ascending and distinct, k ≥ 1
  Tensor values;  // this worker's copy: a view, any strides; same shape and dtype everywhere
};

// holders[id mod k] (the non-negative residue): the rank that publishes the slice.
int slice_publisher(int64_t id, const std::vector<int>& holders);

class SlicePublisher {
 public:
  // Tags of publish()'s messages on the group: kPublishTag + the dtype's index.
  static constexpr int kPublishTag = 0x5e0;

  // Collective over `group`, which must outlive the publisher; the views stay the caller's and
  // must remain the memory of the model's copies (Note [SDP publication]).
  SlicePublisher(Communicator& group, std::vector<PublishedSlice> slices);
  SlicePublisher(const SlicePublisher&) = delete;
  SlicePublisher& operator=(const SlicePublisher&) = delete;

  // Collective over the group: every slice's publisher sends its values to the workers that do
  // not hold it, whose copies are overwritten; holders' copies are untouched. Blocks until this
  // worker's messages completed and its copies are written.
  void publish();

  // Per publish() on this worker: the elements of the slices it does not hold, and the elements
  // it sends (its published slices, each times its number of non-holders).
  int64_t elements_received() const { return received_; }
  int64_t elements_sent() const { return sent_; }
  // Messages per publish() (one per peer and dtype with something to move).
  int messages_received() const { return static_cast<int>(recvs_.size()); }
  int messages_sent() const { return static_cast<int>(sends_.size()); }
  // Elements of the staging buffers (Note [SDP publication staging]).
  int64_t staging_elements() const;
  // "SlicePublisher on group dp: 24 slices (9 held here); per publish sends 5 messages
  // (1200 elements), receives 3 messages (2100 elements); staging 3300 elements".
  std::string describe() const;

 private:
  struct StagedSlice {  // one slice inside a staging region
    int64_t offset = 0;
    Tensor values;
  };
  struct Region {  // a contiguous part of a staging buffer, packed or unpacked as a whole
    Tensor flat;
    std::vector<StagedSlice> slices;
  };
  struct Message {
    int peer = 0;
    int tag = 0;
    int region = 0;  // in pack_ (sends) or unpack_ (receives)
  };

  Communicator& group_;
  int64_t num_slices_ = 0;
  int64_t num_held_ = 0;
  std::vector<Region> pack_;    // send regions, each packed once per publish()
  std::vector<Region> unpack_;  // receive regions, one per (publisher, dtype)
  std::vector<Message> sends_;  // in issue order
  std::vector<Message> recvs_;
  std::vector<Tensor> staging_;  // the buffers the regions are views of
  int64_t received_ = 0;
  int64_t sent_ = 0;
};

}  // namespace loom::parallel::sdp
