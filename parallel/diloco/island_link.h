// parallel/diloco/island_link.h — IslandLink: how DiLoCo's islands meet and talk. The control
// (who takes part in a round, whether the round counts) goes through files in a shared
// directory (Note [Quorum]); the data goes over Gloo's TCP collectives between the islands'
// lanes (Note [Lanes] in parallel/diloco/island_lanes.h), one Gloo context per round and lane,
// made for that round's members only, so an island that died is simply not in the next one.
//
// Note [Quorum]: every sync is a round, named by the inner step and fragment that start it
// (rounds/<step>-f<fragment>/ in parallel.diloco.rendezvous). An island's lane 0 arrives by
// writing member-<island> (its committed-round count, whether it needs the state, its model
// digest and lane count); it waits until every island it expects has arrived — the members of
// the last quorum it was in, and the islands that announced themselves with joining-<island> —
// or parallel.diloco.quorum_timeout_s has passed, then publishes the quorum: the member files
// present, in one file made with link(2), which fails when another island published first, so
// every island reads the same quorum. The island holding the newest outer state (most commits,
// lowest id) is the source; members behind it or joining contribute nothing and receive the
// state after the round. After the exchange each lane of each member votes; the first lane to
// see every vote ok, or a vote fail, or its deadline (parallel.comm_timeout_s) pass, publishes
// the outcome the same way, and a round counts only if that outcome is commit: an island dying
// mid-exchange aborts the round on every island alike, never half of them. An island that was
// not let in (late, or restarted) announces itself with joining-<island> and is let into the
// next round, whose source sends it the state. Files only ever appear (publish by link(2));
// nothing is rewritten, so a directory on NFS or Lustre works as a local one does.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace loom::parallel::diloco {

// A failure of the link (a peer gone, a deadline passed): the round does not count. Its message
// says what failed, in Loom's words (no source location: the network is at fault, not the code).
struct LinkError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LinkOptions {
  std::string dir;  // parallel.diloco.rendezvous
  int island = 0, islands = 1, lanes = 1;
  int lane = 0;         // this rank's lane (−1: none)
  std::string address;  // this host's address for Gloo ("": found)
  double quorum_timeout_s = 30, join_timeout_s = 600, op_timeout_s = 300;
};

struct Member {
  int island = 0;
  int64_t commits = 0;   // rounds whose outcome this island applied (its outer state's version)
  bool joining = false;  // holds no usable state (restarted, or was left out)
  uint64_t digest = 0;   // the model's (IslandLanes::model_digest)
  int lanes = 1;
};

struct Quorum {
  std::string round;
  std::vector<Member> members;  // by island id
  int source = -1;              // the island whose state is newest

  int index_of(int island) const;  // −1: not a member
  const Member& member(int island) const;
  // Whether an island's pseudo-gradient counts (it holds the source's state) / it gets the state.
  bool contributes(int island) const;
  bool receives_state(int island) const { return index_of(island) >= 0 && !contributes(island); }
  int contributors() const;
};

class LaneRound;

class IslandLink {
 public:
  explicit IslandLink(LinkOptions o);
  ~IslandLink();
  const LinkOptions& options() const { return o_; }

  // Whether a round of this job has ever committed: a starting island then joins (Note
  // [Quorum]) instead of starting the job with the others.
  bool job_running() const;
  // Lane 0 registers `me` for round `key` and decides or reads the quorum; other lanes read it.
  // `expect_all`: the job's first round (every island expected, for join_timeout_s).
  Quorum form(const std::string& key, const Member& me, bool expect_all);
  // A joining island's lane 0: waits for a round it is let into (join_timeout_s), announcing
  // itself; its other lanes read that round's quorum.
  Quorum join(const Member& me);
  Quorum read(const std::string& key);
  // This lane's Gloo context over the quorum's members (collective over them).
  std::unique_ptr<LaneRound> open(const Quorum& q);
  // Removes the rounds older than the newest `keep` (by lane 0 of the source, after a commit).
  void prune(size_t keep);
  // Marks this island done; a finished job's directory is refused at the next start.
  void finish();

 private:
  friend class LaneRound;
  std::string round_dir(const std::string& key) const;
  std::vector<int> expected_;  // the islands of the last quorum this island was in
  LinkOptions o_;
  std::shared_ptr<gloo::transport::Device> device_;
};

// One round's exchange on one lane: Gloo collectives over the quorum's members (rank = index
// in the quorum). Every failure is a LinkError.
class LaneRound {
 public:
  LaneRound(IslandLink& link, const Quorum& q);
  ~LaneRound();
  int size() const { return static_cast<int>(q_.members.size()); }
  // Σ over the members, in place.
  void all_reduce(std::vector<float>& v);
  // Every member's bytes (equal sizes), in member order.
  std::vector<std::vector<uint8_t>> all_gather(const std::vector<uint8_t>& mine);
  void send(int island, const std::vector<uint8_t>& bytes);
  std::vector<uint8_t> recv(int island, size_t bytes);
  // This lane's vote; the round's outcome as published (Note [Quorum]): true = commit.
  bool conclude(bool ok);
  // Bytes this lane sent to other islands in this round.
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  IslandLink& link_;
  Quorum q_;
  std::shared_ptr<gloo::Context> ctx_;
  uint32_t tag_ = 0;
  int64_t bytes_sent_ = 0;
};

}  // namespace loom::parallel::diloco
