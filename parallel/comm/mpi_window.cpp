// parallel/comm/mpi_window.cpp — the MPI RMA OneSidedWindow (see parallel/comm/one_sided.h:
// MpiCommunicator::one_sided_window) and join_works. CPU tensors only; the CUDA design is in
// docs/parallel.md ("ODC").
//
// Note [ODC over MPI RMA]: the window's memory is MPI's (not MPI_Win_create over a Loom tensor:
// Open MPI's shared-memory one-sided component, osc/sm, serves only windows MPI allocates), over
// a communicator of its own over the group's members (MPI_Comm_create_group), so its barrier
// never interleaves with the group's collectives. When every member is on one node it is
// MPI_Win_allocate_shared, which Open MPI always serves with osc/sm; otherwise MPI_Win_allocate,
// served by osc/ucx or osc/rdma. (On the development VM a plain MPI_Win_allocate sometimes got
// osc/rdma, whose shared-memory set-up failed there — "unlink /dev/shm/osc_rdma…" — and whose
// accumulates then went missing: the ODC tests fail under `--mca osc rdma` and pass under osc/sm
// and osc/ucx. Across hosts: osc/ucx, Note [RMA component] in
// parallel/launcher.cpp; tested in ctest multihost.parallel.odc_*.) RMA calls on a shared window
// are ordinary MPI; nothing here uses its load/store access to other ranks' memory. It is opened
// for passive-target access to every member once, at creation (MPI_Win_lock_all with
// MPI_MODE_NOCHECK), and closed only when destroyed: there is no per-transfer lock and no epoch per
// step. get = MPI_Rget, accumulate = MPI_Raccumulate (MPI_SUM; MPI orders accumulates of one origin
// to one location, and makes each element's update atomic with respect to other accumulates), flush
// = MPI_Win_flush_all, barrier = MPI_Win_sync, an arrival exchange, MPI_Win_sync (the sync makes
// local stores and remote updates agree in the separate memory model; it costs nothing in the
// unified one). Requests are polled with MPI_Test from the calling thread (MPI runs with
// MPI_THREAD_MULTIPLE: the communicators' threads call MPI at the same time). Progress: on one node
// osc/sm copies through shared memory inside the origin's call, so an owner busy computing never
// delays a transfer (checked on Open MPI 4.1.4: 4 ranks exchanged 4 MiB Rget/Accumulate while the
// owners made no MPI call). Across nodes the owner's progress depends on the component
// (osc/ucx and osc/rdma use RDMA hardware; without it transfers progress only when the owner
// enters MPI).
//
// Note [ODC deadlines]: every wait honours the window's timeout (parallel.comm_timeout_s) and
// names the operation, the window and the peer. Gets and accumulates are requests polled with a
// deadline (RmaWork). The barrier is not MPI_Barrier, which can neither time out nor say who is
// missing: each member posts a zero-byte MPI_Irecv from, and an MPI_Isend to, every other member
// on the window's own communicator and polls them (MPI_Testsome) until the deadline; the receives
// still pending then name the members that have not arrived. Receiving every member's message is
// the synchronisation MPI_Barrier gives (MPI-3 §11.5.4: any process synchronisation orders RMA
// epochs), at 2(S−1) empty messages per member per barrier — once per step. Messages of
// consecutive barriers cannot mix: MPI does not reorder messages of one sender, tag and
// communicator. After a timeout the pending requests are freed (MPI completes them in the
// background; they carry no data), so a late member's arrival is matched and a later barrier
// of every member still works. The blocking calls MPI offers no request for — creating the
// window (MPI_Comm_create_group, MPI_Win_allocate{,_shared}) and, across nodes,
// MPI_Win_flush_all, which may wait for a stopped target — run on a thread of their own that the
// caller waits for until the deadline; on a timeout that thread is left blocked inside MPI (the
// error ends the job: parallel/launcher.h's abort).
#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "core/error.h"
#include "parallel/comm/one_sided.h"

#if LOOM_HAS_MPI
#include <mpi.h>

#include "parallel/comm/mpi_communicator.h"
#endif

namespace loom::parallel {
namespace {

class JoinedWork final : public Work {
 public:
  explicit JoinedWork(std::vector<WorkPtr> works) : works_(std::move(works)) {}
  void wait() override {
    for (WorkPtr& w : works_) w->wait();
  }
  bool is_done() const override {
    for (const WorkPtr& w : works_) {
      if (!w->is_done()) return false;
    }
    return true;
  }

 private:
  std::vector<WorkPtr> works_;
};

}  // namespace

WorkPtr join_works(std::vector<WorkPtr> works) {
  return std::make_shared<JoinedWork>(std::move(works));
}

#if LOOM_HAS_MPI
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kCreateTag = 0x0dc;   // MPI_Comm_create_group's tag for the windows' communicators
constexpr int kBarrierTag = 0x0db;  // the barrier's arrival messages, on the window's communicator

Clock::time_point deadline_after(double timeout_s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

// Runs `call` (a blocking MPI call with no request form) on a thread of its own and waits for it
// until `timeout_s` has passed; then throws `what()` + " did not complete within … s" and leaves
// the thread blocked (Note [ODC deadlines]). `call` must own or share everything it touches.
void call_with_deadline(std::function<void()> call, double timeout_s,
                        const std::function<std::string()>& what) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  auto state = std::make_shared<State>();
  std::thread worker([state, call = std::move(call)] {
    std::exception_ptr error;
    try {
      call();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(state->mu);
    state->error = error;
    state->done = true;
    state->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(state->mu);
  if (!state->cv.wait_until(lock, deadline_after(timeout_s), [&] { return state->done; })) {
    lock.unlock();
    worker.detach();
    LOOM_FAIL(what(), " did not complete within ", timeout_s, " s");
  }
  lock.unlock();
  worker.join();
  if (state->error) std::rethrow_exception(state->error);
}

// Sleeps a little more each time a poll finds nothing done (yield first, then 20 µs naps).
void backoff(int& spins) {
  if (++spins < 64)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(20));
}

MPI_Datatype mpi_type(DType t, const std::string& where) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    default:
      LOOM_FAIL(where, ": windows hold f32 or f64, not ", dtype_name(t));
  }
}

// An MPI_Rget or MPI_Raccumulate in flight; keeps its tensor alive.
class RmaWork final : public Work {
 public:
  RmaWork(MPI_Request req, Tensor keep, std::string what, double timeout_s)
      : req_(req),
        keep_(std::move(keep)),
        what_(std::move(what)),
        deadline_(deadline_after(timeout_s)),
        timeout_s_(timeout_s) {}
  ~RmaWork() override {
    if (!done_) {  // an abandoned request (a failed step): let MPI finish it, never free it early
      try {
        wait();
      } catch (...) {  // a destructor must not throw; the step reported the error
      }
    }
  }
  void wait() override {
    int spins = 0;
    while (!test()) {
      LOOM_CHECK(Clock::now() < deadline_, what_, " did not complete within ", timeout_s_, " s");
      backoff(spins);
    }
  }
  bool is_done() const override { return test(); }

 private:
  bool test() const {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), "MPI_Test", what_);
    if (flag != 0) {
      done_ = true;
      keep_ = Tensor();
    }
    return done_;
  }

  mutable MPI_Request req_;
  mutable Tensor keep_;
  mutable bool done_ = false;
  std::string what_;
  Clock::time_point deadline_;
  double timeout_s_;
};

class MpiWindow final : public OneSidedWindow {
 public:
  MpiWindow(MPI_Comm parent, int64_t numel, DType dtype, std::string name, double timeout_s)
      : name_(std::move(name)),
        numel_(numel),
        dtype_(dtype),
        type_(mpi_type(dtype, name_)),
        elem_(static_cast<int64_t>(dtype_size(dtype))),
        timeout_s_(timeout_s) {
    LOOM_CHECK(numel > 0, name_, ": a window needs at least one element, got ", numel);
    LOOM_CHECK(timeout_s > 0, name_, ": the timeout must be > 0 s, got ", timeout_s);
    // The group's members, in its order, as a new communicator made over MPI_COMM_WORLD
    // (collective over the members only): the group's own MPI communicator is left to its
    // communicator thread, which may be running an operation on it right now.
    MPI_Group members = MPI_GROUP_NULL;
    check_mpi(MPI_Comm_group(parent, &members), "MPI_Comm_group", name_);
    world_ranks_ = world_ranks_of(members);
    const MPI_Aint bytes = static_cast<MPI_Aint>(numel * elem_);
    struct Made {  // written by the creating thread (Note [ODC deadlines])
      MPI_Comm comm = MPI_COMM_NULL;
      MPI_Win win = MPI_WIN_NULL;
      void* base = nullptr;
      bool shared = false;
    };
    auto made = std::make_shared<Made>();
    const int elem = static_cast<int>(elem_);
    call_with_deadline(
        [made, members, bytes, elem, label = name_] {
          check_mpi(MPI_Comm_create_group(MPI_COMM_WORLD, members, kCreateTag, &made->comm),
                    "MPI_Comm_create_group", label);
          // A window MPI cannot make is reported here, not by MPI's abort (Note [RMA component]
          // in parallel/launcher.cpp)
          MPI_Comm_set_errhandler(made->comm, MPI_ERRORS_RETURN);
          made->shared = on_one_node(made->comm, label);
          if (made->shared) {  // shared memory: osc/sm (Note [ODC over MPI RMA])
            MPI_Info info = MPI_INFO_NULL;
            MPI_Info_create(&info);
            MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each rank's part near its core
            const int rc =
                MPI_Win_allocate_shared(bytes, elem, info, made->comm, &made->base, &made->win);
            MPI_Info_free(&info);
            check_mpi(rc, "MPI_Win_allocate_shared", label);
          } else {
            const int rc =
                MPI_Win_allocate(bytes, elem, MPI_INFO_NULL, made->comm, &made->base, &made->win);
            if (rc != MPI_SUCCESS) {
              char text[MPI_MAX_ERROR_STRING];
              int len = 0;
              MPI_Error_string(rc, text, &len);
              LOOM_FAIL(label,
                        ": MPI cannot make a one-sided window across hosts (MPI_Win_allocate: ",
                        std::string(text, static_cast<size_t>(len)),
                        "); ODC needs an RMA component that serves one: with Open MPI, osc/ucx "
                        "(mpirun --mca osc sm,ucx, or OMPI_MCA_osc=sm,ucx; Loom asks for it itself "
                        "when Open MPI has the plugin), on other MPIs their RMA over the network "
                        "(docs/parallel.md, \"Running on several hosts\")");
            }
          }
        },
        timeout_s_, [&] { return name_ + ": creating the window over " + members_text(); });
    MPI_Group_free(&members);
    comm_ = made->comm;
    win_ = made->win;
    base_ = made->base;
    shared_ = made->shared;
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    std::memset(base_, 0, static_cast<size_t>(numel * elem_));
    check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "MPI_Win_lock_all", name_);
    barrier();  // every member's zeroes are in place before anyone accumulates
  }

  ~MpiWindow() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // Freeing is collective: while unwinding an error on this rank the peers may never arrive,
    // so the window (and its communicator) is leaked instead; the job is about to end.
    if (finalized != 0 || std::uncaught_exceptions() > 0) return;
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);
    MPI_Comm_free(&comm_);
  }
  MpiWindow(const MpiWindow&) = delete;
  MpiWindow& operator=(const MpiWindow&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  int64_t numel() const override { return numel_; }
  DType dtype() const override { return dtype_; }

  WorkPtr get_async(int owner, int64_t offset, Tensor dst) override {
    const std::string what = describe("get from", owner, offset, dst);
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(
        MPI_Rget(dst.raw_data(), count(dst), type_, owner, offset, count(dst), type_, win_, &req),
        "MPI_Rget", what);
    return std::make_shared<RmaWork>(req, std::move(dst), what, timeout_s_);
  }

  WorkPtr accumulate_async(int owner, int64_t offset, Tensor src) override {
    const std::string what = describe("accumulate into", owner, offset, src);
    unflushed_.insert(owner);
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(MPI_Raccumulate(src.raw_data(), count(src), type_, owner, offset, count(src), type_,
                              MPI_SUM, win_, &req),
              "MPI_Raccumulate", what);
    return std::make_shared<RmaWork>(req, std::move(src), what, timeout_s_);
  }

  void flush() override {
    const MPI_Win win = win_;
    const std::string name = name_;
    if (shared_) {  // osc/sm: the accumulates are stores already made; the flush cannot block
      check_mpi(MPI_Win_flush_all(win), "MPI_Win_flush_all", name);
      unflushed_.clear();
      return;
    }
    call_with_deadline(
        [win, name] { check_mpi(MPI_Win_flush_all(win), "MPI_Win_flush_all", name); }, timeout_s_,
        [&] {
          return name_ + ": flushing the accumulates into " + ranks_text(unflushed_) +
                 " (MPI_Win_flush_all)";
        });
    unflushed_.clear();
  }

  // Note [ODC deadlines]: an arrival message to and from every other member, polled until the
  // deadline.
  void barrier() override {
    check_mpi(MPI_Win_sync(win_), "MPI_Win_sync", name_);
    std::vector<MPI_Request> reqs;  // receives first: reqs[i] for peer i (i != rank_), then sends
    std::vector<int> peers;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      peers.push_back(p);
      reqs.push_back(MPI_REQUEST_NULL);
      check_mpi(MPI_Irecv(nullptr, 0, MPI_BYTE, p, kBarrierTag, comm_, &reqs.back()), "MPI_Irecv",
                name_);
    }
    for (int p : peers) {
      reqs.push_back(MPI_REQUEST_NULL);
      check_mpi(MPI_Isend(nullptr, 0, MPI_BYTE, p, kBarrierTag, comm_, &reqs.back()), "MPI_Isend",
                name_);
    }
    const auto deadline = deadline_after(timeout_s_);
    std::vector<int> done(reqs.size());
    int spins = 0;
    while (true) {  // MPI_Testsome sets what completed to MPI_REQUEST_NULL; all null: arrived
      int count = 0;
      check_mpi(MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &count, done.data(),
                             MPI_STATUSES_IGNORE),
                "MPI_Testsome", name_);
      if (count == MPI_UNDEFINED) break;
      if (Clock::now() >= deadline) barrier_timed_out(peers, reqs);
      if (count == 0) backoff(spins);
    }
    check_mpi(MPI_Win_sync(win_), "MPI_Win_sync", name_);
  }

  void write_local(int64_t offset, const Tensor& src) override {
    check_local(offset, src.numel(), src);
    std::memcpy(local(offset), src.raw_data(), src.nbytes());
  }

  void zero_local(int64_t offset, int64_t n) override {
    check_range(offset, n);
    std::memset(local(offset), 0, static_cast<size_t>(n * elem_));
  }

  void reduce_local(int64_t offset, int64_t stride, int slots, double divisor,
                    const Tensor& out) override {
    const int64_t n = out.numel();
    LOOM_CHECK(slots >= 1, name_, ": reduce_local over ", slots, " slots");
    check_local(offset, n, out);
    check_range(offset + (slots - 1) * stride, n);
    if (dtype_ == DType::kF32)
      reduce<float>(offset, stride, slots, divisor, out);
    else
      reduce<double>(offset, stride, slots, divisor, out);
  }

 private:
  template <typename T>
  void reduce(int64_t offset, int64_t stride, int slots, double divisor, const Tensor& out) {
    const int64_t n = out.numel();
    const T* src = static_cast<const T*>(local(offset));
    T* dst = out.data<T>();
    std::copy(src, src + n, dst);
    for (int k = 1; k < slots; ++k) {
      const T* row = src + static_cast<int64_t>(k) * stride;
      for (int64_t i = 0; i < n; ++i) dst[i] += row[i];
    }
    const T d = static_cast<T>(divisor);
    for (int64_t i = 0; i < n; ++i) dst[i] /= d;
  }

  // Whether every member of `comm` shares this rank's node (collective over comm).
  static bool on_one_node(MPI_Comm comm, const std::string& name) {
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type", name);
    int node_size = 0, size = 0;
    MPI_Comm_size(node, &node_size);
    MPI_Comm_size(comm, &size);
    MPI_Comm_free(&node);
    int all = node_size == size ? 1 : 0;  // every member must take the same branch
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce", name);
    return all == 1;
  }

  // The world rank of each member of `group`, in the group's order.
  static std::vector<int> world_ranks_of(MPI_Group group) {
    int n = 0;
    MPI_Group_size(group, &n);
    MPI_Group world = MPI_GROUP_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) in[static_cast<size_t>(i)] = i;
    MPI_Group_translate_ranks(group, n, in.data(), world, out.data());
    MPI_Group_free(&world);
    return out;
  }

  // "rank 1 (world rank 5)", "ranks 1 (world rank 5), 3 (world rank 7)".
  std::string ranks_text(const std::set<int>& ranks) const {
    std::string out = ranks.size() == 1 ? "rank " : "ranks ";
    bool first = true;
    for (int r : ranks) {
      out += (first ? "" : ", ") + std::to_string(r) + " (world rank " +
             std::to_string(world_ranks_.at(static_cast<size_t>(r))) + ")";
      first = false;
    }
    return ranks.empty() ? "no rank" : out;
  }

  std::string members_text() const { return std::to_string(world_ranks_.size()) + " ranks"; }

  // Throws naming the members whose arrival message has not come (Note [ODC deadlines]); frees
  // the pending requests, which MPI completes in the background.
  [[noreturn]] void barrier_timed_out(const std::vector<int>& peers,
                                      std::vector<MPI_Request>& reqs) {
    std::set<int> missing;
    for (size_t i = 0; i < peers.size(); ++i) {
      if (reqs[i] != MPI_REQUEST_NULL) missing.insert(peers[i]);
    }
    for (MPI_Request& r : reqs) {
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    }
    LOOM_FAIL(name_, ": barrier (the window's synchronisation over ", members_text(),
              ") did not complete within ", timeout_s_, " s: ", ranks_text(missing),
              missing.size() == 1 ? " has" : " have", " not arrived");
  }

  void* local(int64_t offset) const { return static_cast<char*>(base_) + offset * elem_; }

  void check_range(int64_t offset, int64_t n) const {
    LOOM_CHECK(offset >= 0 && n >= 0 && offset + n <= numel_, name_, ": [", offset, ", ",
               offset + n, ") outside the window's ", numel_, " elements");
  }

  void check_local(int64_t offset, int64_t n, const Tensor& t) const {
    check_tensor(t);
    check_range(offset, n);
  }

  void check_tensor(const Tensor& t) const {
    LOOM_CHECK(t.defined() && t.is_contiguous() && t.device().is_cpu() && t.dtype() == dtype_,
               name_, ": transfers take contiguous CPU ", dtype_name(dtype_), " tensors");
  }

  int count(const Tensor& t) const {
    LOOM_CHECK(t.numel() <= INT_MAX, name_, ": ", t.numel(),
               " elements exceed MPI's int count limit");
    return static_cast<int>(t.numel());
  }

  std::string describe(const char* verb, int owner, int64_t offset, const Tensor& t) const {
    check_tensor(t);
    LOOM_CHECK(owner >= 0 && owner < size_, name_, ": owner ", owner, " outside the group of ",
               size_);
    check_range(offset, t.numel());
    return name_ + ": " + verb + " rank " + std::to_string(owner) + " [" + std::to_string(offset) +
           ", " + std::to_string(offset + t.numel()) + ")";
  }

  std::string name_;
  int64_t numel_;
  DType dtype_;
  MPI_Datatype type_;
  int64_t elem_;
  double timeout_s_;
  std::vector<int> world_ranks_;  // of each member, for errors
  std::set<int> unflushed_;       // owners accumulated into since the last flush, for errors
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  void* base_ = nullptr;
  bool shared_ = false;  // every member on one node: osc/sm
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<OneSidedWindow> MpiCommunicator::one_sided_window(int64_t numel, DType dtype,
                                                                  std::string name,
                                                                  double timeout_s) {
  return std::make_unique<MpiWindow>(comm_, numel, dtype, std::move(name), timeout_s);
}

#endif  // LOOM_HAS_MPI (without it there is no MpiCommunicator: the default refuses)

}  // namespace loom::parallel
