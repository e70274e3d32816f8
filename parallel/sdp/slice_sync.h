// parallel/sdp/slice_sync.h — SliceSync: SDP's gradient synchronisation (subnetwork data
// parallelism, arXiv 2507.09029). Each parameter slice's gradient is averaged over the workers
// that hold that slice, and only over them: one communicator per distinct holder set, made from
// the data-parallel group, and the slices of one set packed into flat buckets whose all-reduce
// (kAvg) is issued while backward runs. It takes the holder sets as given (the assignment, which
// slices a worker holds, is made elsewhere), owns no gradient memory beyond its buckets, and
// touches no slice this worker does not hold.
//
// Note [SDP holder groups]: every worker passes the slices it holds, each with its holder set
// (ranks of the dp group). Construction is collective over the dp group: the slice lists are
// all-gathered and checked to agree (each slice's holders, size and dtype the same on every
// holder, and each holder listing it), so a mismatched assignment is one error on every rank
// instead of a hang. Then every worker creates the communicators of the sets it belongs to —
// and no other — in one global order (the sets sorted lexicographically), each named like
// "sdp{0,2}" with member i the i-th smallest holder. Creation is collective over a set's
// members only (MpiCommunicator::create, MPI_Comm_create_group); since every worker goes
// through its sets in the same global order, a worker waiting on a set waits only for workers
// busy with an earlier set, so creation cannot deadlock. A set of one holder gets no
// communicator: its average is the gradient itself.
//
// Note [SDP bucket order]: within a holder set, the slices are laid out in ascending slice id
// and cut into buckets of at most bucket_bytes (a new bucket where the dtype or device changes;
// a larger slice gets its own). launch(id) copies the slice's gradient into its bucket (any
// layout: a column block of a down projection is a strided view); a bucket is complete when all
// of its slices were launched, and a set's buckets are issued strictly in ascending index — a
// bucket completed early waits until the buckets before it are issued. So each communicator
// sees the same operations in the same order on every member, whatever order the hooks fire in
// (which may differ between workers), and with the default bucket size most sets have a single
// bucket: one operation per set per step. Give the slices ids in the order backward completes
// them (later layers first) so that the first bucket of a set is not the last one ready. The
// average is MpiCommunicator's rank-order sum divided by the holder count (Note [Deterministic
// reductions]): bitwise the same on every holder and in every run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::sdp {

// One slice this worker holds.
struct HeldSlice {
  int64_t id = 0;            // global: the same on every holder, unique among the slices
  std::vector<int> holders;  // ranks in the dp group, ascending and distinct; this rank is one
  Tensor grad;  // this worker's gradient of the slice, any layout (a view), f32/f64/bf16/f16
};

// Makes the communicator over `members` (ascending ranks of the dp group, this rank among
// them), collectively over the members only; `index` is the set's position in the global
// creation order (the same on every member).
using HolderGroupFactory = std::function<std::unique_ptr<Communicator>(
    const std::vector<int>& members, const std::string& name, int index)>;

struct SliceSyncOptions {
  size_t bucket_bytes = 25u << 20;  // target bytes per bucket (Note [SDP bucket order])
  double timeout_s = 0;             // the groups' timeout; 0: default_comm_timeout_s()
  // Empty: sub-communicators of the dp group's MPI communicator (holder_group_factory).
  HolderGroupFactory make_group;
};

// The default factory: MpiCommunicator::create over `dp`'s MPI communicator. Throws naming the
// group when `dp` is not an MpiCommunicator (the CUDA path, NCCL sub-communicators, is not built
// yet) or the build has no MPI.
HolderGroupFactory holder_group_factory(Communicator& dp, double timeout_s);

// "sdp{0,2}".
std::string holder_group_name(const std::vector<int>& holders);

class SliceSync {
 public:
  // Collective over `dp` (Note [SDP holder groups]); every worker calls it, also one holding no
  // slice. The gradient tensors stay the caller's: they must remain the memory the step's
  // gradients are in, and are read at launch and written at finish. The default factory's
  // creation messages use tags 0x5d0 + set index on dp's MPI communicator: construct while no
  // send or recv is pending on dp.
  SliceSync(Communicator& dp, std::vector<HeldSlice> slices, SliceSyncOptions options = {});
  ~SliceSync();
  SliceSync(const SliceSync&) = delete;
  SliceSync& operator=(const SliceSync&) = delete;

  // The slice's gradient is final for this step: it is copied into its bucket, and the set's
  // complete buckets are issued in order (Note [SDP bucket order]). Once per slice per step;
  // throws naming the slice for an id this worker does not hold or one launched twice.
  void launch(int64_t slice_id);
  // Launches the slices not launched yet (ascending id), waits for every bucket, and writes
  // each held slice's average over its holders into its gradient tensor. Then the next step
  // may begin. finish() alone is a blocking synchronisation of every slice.
  void finish();

  // The holder sets this worker has a communicator for (every set of two or more holders among
  // its slices), in creation order, and the communicator of one of them.
  std::vector<std::vector<int>> holder_sets() const;
  Communicator& group(const std::vector<int>& holders) const;
  int num_buckets() const;  // over the sets with a communicator (a set of one needs none)

 private:
  struct Slice;
  struct Bucket;
  struct HolderSet;
  void place(Slice& slice, int set_index, size_t bucket_bytes);
  void issue_ready(HolderSet& set);

  std::vector<Slice> slices_;  // ascending id
  std::vector<HolderSet> sets_;
  std::vector<Bucket> buckets_;
};

}  // namespace loom::parallel::sdp
