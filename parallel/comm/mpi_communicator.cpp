// parallel/comm/mpi_communicator.cpp — MpiCommunicator: operations as chains of nonblocking
// MPI calls run by the communicator's worker thread (Note [MPI communicator thread]), and the
// rank-order reductions (Note [Deterministic reductions]). MPI only moves bits here (words of
// the element's size); it never reduces, so results do not depend on MPI's algorithm choice.
//
// Note [All-reduce as reduce-scatter + all-gather]: the tensor is cut into `size` chunks (the
// first numel % size one element longer). MPI_Ialltoallv sends chunk j to member j; member j
// then sums the `size` copies of its chunk in rank order in the tensor's dtype (bf16/f16: in
// f32, rounded once) and
// MPI_Iallgatherv returns every reduced chunk to everyone. Each chunk is reduced by exactly
// one member, so every member ends with the same bits, equal to a rank-order sum.
//
// Note [Staging CUDA tensors]: a CUDA tensor is accepted by copying it through a page-locked
// host buffer (kernels/host_staging.h, so this file needs no CUDA header): an input is copied
// to the host when the operation is issued — on the calling thread, which therefore blocks
// until the work already issued on the device has finished — and an output is copied back to
// the device by the worker thread once MPI has completed, before the Work reports done. So a
// staged operation has the CPU semantics: after wait() the device tensor holds the result.
// Buffers come from a per-communicator PinnedPool: one per operation in flight, each reused
// and replaced by a larger one when a message outgrows it (so it settles at the largest
// message). This path exists so that several ranks sharing one GPU can run the parallel
// tests; NcclCommunicator is the fast path for CUDA tensors.
#include "parallel/comm/mpi_communicator.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <functional>
#include <type_traits>

#include "core/error.h"
#include "kernels/host_staging.h"

namespace loom::parallel {

using Clock = std::chrono::steady_clock;

void check_mpi(int rc, const char* call, const std::string& where) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  LOOM_FAIL(where, ": ", call, " failed: ", std::string(msg, static_cast<size_t>(len)));
}

namespace {

constexpr double kMaxTimeoutS = 1e7;  // keeps deadline arithmetic far from overflow

// MPI moves elements as unsigned words of the element's size (a bit copy).
MPI_Datatype mpi_word_type(DType t) {
  switch (dtype_size(t)) {
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    case 8:
      return MPI_UINT64_T;
    default:
      LOOM_FAIL("MpiCommunicator: no MPI word type for dtype ", dtype_name(t));
  }
}

int mpi_count(int64_t n, const std::string& where) {
  LOOM_CHECK(n <= INT_MAX, where, ": ", n, " elements exceed MPI's int count limit (", INT_MAX,
             "); split the tensor");
  return static_cast<int>(n);
}

void check_tensor(const Tensor& t, const std::string& where, const char* arg) {
  LOOM_CHECK(t.defined(), where, ": ", arg, " is undefined");
  LOOM_CHECK(t.device().is_cpu() ||
                 kernels::Registry::instance().has("copy_device_to_pinned", t.device().type),
             where, ": ", arg, " is on ", t.device().str(),
             "; MpiCommunicator takes CPU tensors (and CUDA tensors in a CUDA build)");
  LOOM_CHECK(t.is_contiguous(), where, ": ", arg, " must be contiguous");
}

void check_reduce_dtype(DType t, ReduceOp op, const std::string& where) {
  const bool floating =
      t == DType::kF32 || t == DType::kF64 || t == DType::kBF16 || t == DType::kF16;
  const bool integer = t == DType::kI32 || t == DType::kI64;
  LOOM_CHECK(floating || integer, where, ": dtype ", dtype_name(t),
             " not supported for reductions (f32, f64, bf16, f16, i32, i64)");
  LOOM_CHECK(floating || op != ReduceOp::kAvg, where, ": kAvg needs a floating dtype, got ",
             dtype_name(t));
}

template <typename T>
T max_of(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return b > a ? b : a;
}

// out (n) ← op over rows (nrows, n), combined strictly in row (= member rank) order.
template <typename T>
void reduce_rows_typed(const T* rows, int nrows, int64_t n, ReduceOp op, T* out) {
  std::copy(rows, rows + n, out);
  for (int j = 1; j < nrows; ++j) {
    const T* row = rows + static_cast<int64_t>(j) * n;
    if (op == ReduceOp::kMax) {
      for (int64_t i = 0; i < n; ++i) out[i] = max_of(out[i], row[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] += row[i];
    }
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (op == ReduceOp::kAvg) {
      const T count = static_cast<T>(nrows);
      for (int64_t i = 0; i < n; ++i) out[i] /= count;
    }
  }
}

// bf16/f16 rows: widened to f32, reduced there in row order, rounded once to the dtype.
template <typename H>
void reduce_rows_16(const H* rows, int nrows, int64_t n, ReduceOp op, H* out) {
  std::vector<float> wide(static_cast<size_t>(nrows) * static_cast<size_t>(n)),
      sum(static_cast<size_t>(n));
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<float>(rows[i]);
  reduce_rows_typed(wide.data(), nrows, n, op, sum.data());
  for (int64_t i = 0; i < n; ++i) out[i] = H(sum[static_cast<size_t>(i)]);
}

void reduce_rows(DType t, const void* rows, int nrows, int64_t n, ReduceOp op, void* out) {
  switch (t) {
    case DType::kBF16:
      return reduce_rows_16(static_cast<const BFloat16*>(rows), nrows, n, op,
                            static_cast<BFloat16*>(out));
    case DType::kF16:
      return reduce_rows_16(static_cast<const Float16*>(rows), nrows, n, op,
                            static_cast<Float16*>(out));
    case DType::kF32:
      return reduce_rows_typed(static_cast<const float*>(rows), nrows, n, op,
                               static_cast<float*>(out));
    case DType::kF64:
      return reduce_rows_typed(static_cast<const double*>(rows), nrows, n, op,
                               static_cast<double*>(out));
    case DType::kI32:
      return reduce_rows_typed(static_cast<const int32_t*>(rows), nrows, n, op,
                               static_cast<int32_t*>(out));
    case DType::kI64:
      return reduce_rows_typed(static_cast<const int64_t*>(rows), nrows, n, op,
                               static_cast<int64_t*>(out));
    default:
      LOOM_FAIL("reduce_rows: dtype ", dtype_name(t));
  }
}

// Shared by an operation's Work handle and the worker thread.
struct OpState {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  bool started = false;      // guarded by mu
  std::exception_ptr error;  // written before done
  CommEvent event;           // group/op/bytes/queued fixed at issue; started/finished by the worker
  std::string what;          // "collective all_reduce", "send to rank 3 (tag 0)"
  int group_size = 1;
  double timeout_s = 0;
  std::shared_ptr<std::atomic<int64_t>> waited_ns;  // the communicator's (Communicator::waited_s)
};

class MpiWork final : public Work {
 public:
  explicit MpiWork(std::shared_ptr<OpState> state) : state_(std::move(state)) {}
  bool is_done() const override { return state_->done.load(std::memory_order_acquire); }

  void wait() override {
    OpState& s = *state_;
    struct Timed {  // adds the time spent here to the communicator's count, however it ends
      std::atomic<int64_t>& total;
      Clock::time_point t0 = Clock::now();
      ~Timed() {
        total += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      }
    } timed{*s.waited_ns};
    std::unique_lock<std::mutex> lock(s.mu);
    const auto deadline = s.event.queued + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(s.timeout_s));
    if (!s.cv.wait_until(lock, deadline, [&] { return s.done.load(); })) {
      LOOM_FAIL(s.what, " on group ", s.event.group, " (", s.group_size,
                " ranks) did not complete within ", s.timeout_s, " s",
                s.started
                    ? ""
                    : " (it never started: an earlier operation on the group is still pending)");
    }
    if (s.error) std::rethrow_exception(s.error);
  }

 private:
  std::shared_ptr<OpState> state_;
};

}  // namespace

// Pinned host buffers for staged CUDA tensors (Note [Staging CUDA tensors]). A buffer handed out
// keeps the pool alive and returns to it when its last reference goes.
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  PinnedPool() = default;
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;
  ~PinnedPool() {
    for (const Buffer& b : free_)
      kernels::find_kernel<kernels::pinned_host_free_k>(b.device)(b.ptr);
  }

  // A buffer of at least `bytes` for tensors of `device`'s type.
  std::shared_ptr<void> acquire(size_t bytes, DeviceType device) {
    Buffer b{nullptr, 0, device};
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = std::max_element(free_.begin(), free_.end(), [&](const Buffer& x, const Buffer& y) {
        return (x.device == device ? x.bytes : 0) < (y.device == device ? y.bytes : 0);
      });
      if (it != free_.end() && it->device == device) {
        b = *it;
        free_.erase(it);
      }
    }
    if (b.ptr != nullptr && b.bytes < bytes) {
      kernels::find_kernel<kernels::pinned_host_free_k>(device)(b.ptr);
      b.ptr = nullptr;
    }
    if (b.ptr == nullptr) {
      b.bytes = std::max<size_t>(bytes, 1);
      b.ptr = kernels::find_kernel<kernels::pinned_host_alloc_k>(device)(b.bytes);
    }
    std::shared_ptr<PinnedPool> self = shared_from_this();
    return std::shared_ptr<void>(b.ptr, [self, b](void*) { self->put(b); });
  }

 private:
  struct Buffer {
    void* ptr;
    size_t bytes;
    DeviceType device;
  };
  void put(const Buffer& b) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(b);
  }

  std::mutex mu_;
  std::vector<Buffer> free_;
};

namespace {

// A tensor as MPI sees it: its own memory (CPU), or a pinned host copy (CUDA). Copies of a
// Staged share the buffer; the last one returns it to the pool.
struct Staged {
  Tensor tensor;                 // the caller's tensor, kept alive until the op completes
  std::shared_ptr<void> pinned;  // the host copy of a CUDA tensor; null for a CPU tensor
  void* data() const { return pinned ? pinned.get() : tensor.raw_data(); }
  // After MPI has completed (on the worker thread): an output's host copy back into the device
  // tensor. The worker makes the tensor's device its own current device first, so its device
  // guards restore to it rather than to (a new context on) device 0.
  void unstage() const {
    if (!pinned) return;
    Tensor t = tensor;
    set_current_device(t.device());
    kernels::find_kernel<kernels::copy_pinned_to_device_k>(t.device().type)(pinned.get(), t);
  }
};

// `copy_in`: the tensor's current contents are needed (an input).
Staged stage(const Tensor& t, bool copy_in, PinnedPool& pool) {
  if (t.device().is_cpu()) return {t, nullptr};
  Staged s{t, pool.acquire(t.nbytes(), t.device().type)};
  if (copy_in) {
    kernels::find_kernel<kernels::copy_device_to_pinned_k>(t.device().type)(t, s.pinned.get());
  }
  return s;
}

}  // namespace

// One operation: phases that each post one nonblocking MPI call (after any local work on the
// previous phase's result), then optional local work once the last call completes.
class MpiOp {
 public:
  enum Step { kPending, kAdvanced, kDone };
  struct Phase {
    const char* call;
    std::function<int(MPI_Comm, MPI_Request*)> post;
  };

  std::shared_ptr<OpState> state = std::make_shared<OpState>();
  bool collective = true;
  std::vector<Phase> phases;
  std::function<void()> on_complete;
  int64_t expect_recv_count = -1;  // recv: the message must hold exactly this many elements
  MPI_Datatype type = MPI_BYTE;
  // A group (send_recv_async under NCCL rules): these ops progress together, instead of phases;
  // the group is done when all are.
  std::vector<std::shared_ptr<MpiOp>> parts;

  std::string where() const { return state->what + " on group " + state->event.group; }

  // Posts the next phase, or tests the one in flight. Called by the worker thread only.
  Step progress(MPI_Comm comm) {
    if (!parts.empty()) return progress_parts(comm);
    if (next_phase_ == 0) return post(comm);
    int flag = 0;
    MPI_Status status;
    check_mpi(MPI_Test(&req_, &flag, &status), "MPI_Test", where());
    if (!flag) return kPending;
    if (next_phase_ < phases.size()) return post(comm);
    if (expect_recv_count >= 0) check_received(status);
    if (on_complete) on_complete();
    return kDone;
  }

 private:
  Step post(MPI_Comm comm) {
    const Phase& p = phases[next_phase_++];
    check_mpi(p.post(comm, &req_), p.call, where());
    return kAdvanced;
  }

  Step progress_parts(MPI_Comm comm) {
    parts_done_.resize(parts.size(), false);
    bool all = true, advanced = false;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts_done_[i]) continue;
      const Step step = parts[i]->progress(comm);
      parts_done_[i] = step == kDone;
      all = all && parts_done_[i];
      advanced = advanced || step != kPending;
    }
    return all ? kDone : advanced ? kAdvanced : kPending;
  }

  void check_received(MPI_Status& status) const {
    int count = 0;
    MPI_Get_count(&status, type, &count);
    LOOM_CHECK(count == expect_recv_count, where(), ": received ", count, " elements, expected ",
               expect_recv_count);
  }

  size_t next_phase_ = 0;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::vector<bool> parts_done_;
};

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, double timeout_s)
    : comm_(comm),
      name_(std::move(name)),
      timeout_s_(std::min(timeout_s, kMaxTimeoutS)),
      pinned_(std::make_shared<PinnedPool>()) {
  LOOM_CHECK(comm != MPI_COMM_NULL, "MpiCommunicator ", name_, ": null MPI communicator");
  LOOM_CHECK(timeout_s > 0, "MpiCommunicator ", name_, ": timeout must be > 0 s, got ", timeout_s);
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", name_);
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", name_);
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", name_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::create(MPI_Comm parent,
                                                         const std::vector<int>& members,
                                                         std::string name, double timeout_s,
                                                         int tag) {
  int parent_rank = 0, parent_size = 0;
  MPI_Comm_rank(parent, &parent_rank);
  MPI_Comm_size(parent, &parent_size);
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  LOOM_CHECK(!members.empty() && sorted.front() >= 0 && sorted.back() < parent_size &&
                 std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
             "MpiCommunicator::create ", name, ": members must be distinct ranks in [0, ",
             parent_size, ")");
  LOOM_CHECK(std::binary_search(sorted.begin(), sorted.end(), parent_rank),
             "MpiCommunicator::create ", name, ": rank ", parent_rank, " is not a member");
  MPI_Group parent_group, group;
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_group(parent, &parent_group), "MPI_Comm_group", name);
  check_mpi(MPI_Group_incl(parent_group, static_cast<int>(members.size()), members.data(), &group),
            "MPI_Group_incl", name);
  const int rc = MPI_Comm_create_group(parent, group, tag, &comm);
  MPI_Group_free(&group);
  MPI_Group_free(&parent_group);
  check_mpi(rc, "MPI_Comm_create_group", name);
  return std::make_unique<MpiCommunicator>(comm, std::move(name), timeout_s);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::duplicate(MPI_Comm parent, std::string name,
                                                            double timeout_s) {
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(parent, &comm), "MPI_Comm_dup", name);
  return std::make_unique<MpiCommunicator>(comm, std::move(name), timeout_s);
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    abandon_now_ = std::uncaught_exceptions() > 0;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !leaked_) MPI_Comm_free(&comm_);
}

void MpiCommunicator::set_observer(CommObserver observer) {
  std::lock_guard<std::mutex> lock(mutex_);
  observer_ = std::move(observer);
}

// ---- issuing ----------------------------------------------------------------------------

namespace {

std::shared_ptr<MpiOp> new_op(const std::string& group, int group_size, double timeout_s,
                              const char* op, std::string what, int64_t bytes, bool collective) {
  auto m = std::make_shared<MpiOp>();
  m->collective = collective;
  m->state->event.group = group;
  m->state->event.op = op;
  m->state->event.bytes = bytes;
  m->state->what = std::move(what);
  m->state->group_size = group_size;
  m->state->timeout_s = timeout_s;
  return m;
}

// Element counts and offsets of `parts` chunks covering n elements (the first n % parts
// chunks one element longer). See Note [All-reduce as reduce-scatter + all-gather].
struct ChunkPlan {
  std::vector<int> counts, offsets;
  std::vector<int> recv_counts, recv_offsets;  // member i's copy of this rank's chunk at i·c
  std::vector<std::byte> scratch;              // (parts, c): the copies, in rank order
};

std::shared_ptr<ChunkPlan> plan_chunks(int64_t n, int parts, int rank) {
  auto plan = std::make_shared<ChunkPlan>();
  int offset = 0;
  for (int j = 0; j < parts; ++j) {
    const int c = static_cast<int>(n / parts + (j < n % parts ? 1 : 0));
    plan->counts.push_back(c);
    plan->offsets.push_back(offset);
    offset += c;
  }
  const int mine = plan->counts[static_cast<size_t>(rank)];
  for (int i = 0; i < parts; ++i) {
    plan->recv_counts.push_back(mine);
    plan->recv_offsets.push_back(i * mine);
  }
  return plan;
}

}  // namespace

WorkPtr MpiCommunicator::all_reduce_async(Tensor t, ReduceOp op) {
  const std::string where = "all_reduce on group " + name_;
  check_tensor(t, where, "t");
  check_reduce_dtype(t.dtype(), op, where);
  mpi_count(t.numel(), where);
  auto m = new_op(name_, size_, timeout_s_, "all_reduce", "collective all_reduce",
                  static_cast<int64_t>(t.nbytes()), true);
  m->type = mpi_word_type(t.dtype());
  auto plan = plan_chunks(t.numel(), size_, rank_);
  const Staged st = stage(t, true, *pinned_);
  const MPI_Datatype type = m->type;
  const size_t esize = dtype_size(t.dtype());
  const int rank = rank_, size = size_;
  m->phases.push_back({"MPI_Ialltoallv", [plan, st, type, esize, rank](MPI_Comm c, MPI_Request* r) {
                         const int mine = plan->counts[static_cast<size_t>(rank)];
                         plan->scratch.resize(plan->recv_counts.size() * static_cast<size_t>(mine) *
                                              esize);
                         return MPI_Ialltoallv(st.data(), plan->counts.data(), plan->offsets.data(),
                                               type, plan->scratch.data(), plan->recv_counts.data(),
                                               plan->recv_offsets.data(), type, c, r);
                       }});
  m->phases.push_back(
      {"MPI_Iallgatherv", [plan, st, type, esize, rank, size, op](MPI_Comm c, MPI_Request* r) {
         const size_t me = static_cast<size_t>(rank);
         char* chunk =
             static_cast<char*>(st.data()) + static_cast<size_t>(plan->offsets[me]) * esize;
         reduce_rows(st.tensor.dtype(), plan->scratch.data(), size, plan->counts[me], op, chunk);
         plan->scratch = {};
         return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, st.data(), plan->counts.data(),
                                plan->offsets.data(), type, c, r);
       }});
  m->on_complete = [st] { st.unstage(); };
  return enqueue(std::move(m));
}

WorkPtr MpiCommunicator::reduce_scatter_async(Tensor in, Tensor out, ReduceOp op) {
  const std::string where = "reduce_scatter on group " + name_;
  check_tensor(in, where, "in");
  check_tensor(out, where, "out");
  LOOM_CHECK(in.dtype() == out.dtype(), where, ": in is ", dtype_name(in.dtype()), ", out is ",
             dtype_name(out.dtype()));
  LOOM_CHECK(in.numel() == size_ * out.numel(), where, ": in has ", in.numel(),
             " elements, expected size ", size_, " x out ", out.numel());
  check_reduce_dtype(in.dtype(), op, where);
  const int n = mpi_count(in.numel(), where) / size_;
  auto m = new_op(name_, size_, timeout_s_, "reduce_scatter", "collective reduce_scatter",
                  static_cast<int64_t>(in.nbytes()), true);
  m->type = mpi_word_type(in.dtype());
  auto scratch = std::make_shared<std::vector<std::byte>>();
  const Staged sin = stage(in, true, *pinned_), sout = stage(out, false, *pinned_);
  const MPI_Datatype type = m->type;
  m->phases.push_back({"MPI_Ialltoall", [sin, scratch, n, type](MPI_Comm c, MPI_Request* r) {
                         scratch->resize(sin.tensor.nbytes());
                         return MPI_Ialltoall(sin.data(), n, type, scratch->data(), n, type, c, r);
                       }});
  const int size = size_;
  m->on_complete = [sout, scratch, n, size, op] {
    reduce_rows(sout.tensor.dtype(), scratch->data(), size, n, op, sout.data());
    sout.unstage();
  };
  return enqueue(std::move(m));
}

WorkPtr MpiCommunicator::all_gather_async(Tensor in, Tensor out) {
  const std::string where = "all_gather on group " + name_;
  check_tensor(in, where, "in");
  check_tensor(out, where, "out");
  LOOM_CHECK(in.dtype() == out.dtype(), where, ": in is ", dtype_name(in.dtype()), ", out is ",
             dtype_name(out.dtype()));
  LOOM_CHECK(out.numel() == size_ * in.numel(), where, ": out has ", out.numel(),
             " elements, expected size ", size_, " x in ", in.numel());
  mpi_count(out.numel(), where);
  const int n = static_cast<int>(in.numel());
  auto m = new_op(name_, size_, timeout_s_, "all_gather", "collective all_gather",
                  static_cast<int64_t>(out.nbytes()), true);
  const MPI_Datatype type = m->type = mpi_word_type(in.dtype());
  const Staged sin = stage(in, true, *pinned_), sout = stage(out, false, *pinned_);
  m->phases.push_back({"MPI_Iallgather", [sin, sout, n, type](MPI_Comm c, MPI_Request* r) {
                         return MPI_Iallgather(sin.data(), n, type, sout.data(), n, type, c, r);
                       }});
  m->on_complete = [sin, sout] { sout.unstage(); };
  return enqueue(std::move(m));
}

WorkPtr MpiCommunicator::all_to_all_async(Tensor in, Tensor out) {
  const std::string where = "all_to_all on group " + name_;
  check_tensor(in, where, "in");
  check_tensor(out, where, "out");
  LOOM_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel(), where,
             ": in and out must have the same dtype and size, got ", dtype_name(in.dtype()), " ",
             in.numel(), " and ", dtype_name(out.dtype()), " ", out.numel());
  LOOM_CHECK(in.numel() % size_ == 0, where, ": ", in.numel(), " elements do not split into ",
             size_, " equal chunks");
  const int n = mpi_count(in.numel(), where) / size_;
  auto m = new_op(name_, size_, timeout_s_, "all_to_all", "collective all_to_all",
                  static_cast<int64_t>(in.nbytes()), true);
  const MPI_Datatype type = m->type = mpi_word_type(in.dtype());
  const Staged sin = stage(in, true, *pinned_), sout = stage(out, false, *pinned_);
  m->phases.push_back({"MPI_Ialltoall", [sin, sout, n, type](MPI_Comm c, MPI_Request* r) {
                         return MPI_Ialltoall(sin.data(), n, type, sout.data(), n, type, c, r);
                       }});
  m->on_complete = [sin, sout] { sout.unstage(); };
  return enqueue(std::move(m));
}

WorkPtr MpiCommunicator::broadcast_async(Tensor t, int root) {
  const std::string where = "broadcast on group " + name_;
  check_tensor(t, where, "t");
  LOOM_CHECK(root >= 0 && root < size_, where, ": root ", root, " out of range [0, ", size_, ")");
  const int n = mpi_count(t.numel(), where);
  auto m = new_op(name_, size_, timeout_s_, "broadcast", "collective broadcast",
                  static_cast<int64_t>(t.nbytes()), true);
  const MPI_Datatype type = m->type = mpi_word_type(t.dtype());
  const bool is_root = rank_ == root;
  const Staged st = stage(t, is_root, *pinned_);
  m->phases.push_back({"MPI_Ibcast", [st, n, type, root](MPI_Comm c, MPI_Request* r) {
                         return MPI_Ibcast(st.data(), n, type, root, c, r);
                       }});
  m->on_complete = [st, is_root] {
    if (!is_root) st.unstage();
  };
  return enqueue(std::move(m));
}

// Under NCCL rules (Note [NCCL rules on MPI]) a transfer occupies the group like a collective
// and a send is synchronous (MPI_Issend: complete only once the receive has matched it).
std::shared_ptr<MpiOp> MpiCommunicator::make_p2p(const P2P& op) {
  const bool send = op.kind == P2P::Kind::kSend;
  const std::string what = send ? detail::str("send to rank ", op.peer, " (tag ", op.tag, ")")
                                : detail::str("recv from rank ", op.peer, " (tag ", op.tag, ")");
  const std::string where = what + " on group " + name_;
  const Tensor& t = op.tensor;
  check_tensor(t, where, "t");
  LOOM_CHECK(op.peer >= 0 && op.peer < size_, where, ": rank out of range [0, ", size_, ")");
  LOOM_CHECK(op.tag >= 0 && op.tag <= 32767, where, ": tag must be in [0, 32767]");
  const int n = mpi_count(t.numel(), where);
  auto m = new_op(name_, size_, timeout_s_, send ? "send" : "recv", what,
                  static_cast<int64_t>(t.nbytes()), nccl_rules_);
  const MPI_Datatype type = m->type = mpi_word_type(t.dtype());
  const int peer = op.peer, tag = op.tag;
  const Staged st = stage(t, send, *pinned_);
  if (send && nccl_rules_) {
    m->phases.push_back({"MPI_Issend", [st, n, type, peer, tag](MPI_Comm c, MPI_Request* r) {
                           return MPI_Issend(st.data(), n, type, peer, tag, c, r);
                         }});
  } else if (send) {
    m->phases.push_back({"MPI_Isend", [st, n, type, peer, tag](MPI_Comm c, MPI_Request* r) {
                           return MPI_Isend(st.data(), n, type, peer, tag, c, r);
                         }});
  } else {
    m->expect_recv_count = n;
    m->phases.push_back({"MPI_Irecv", [st, n, type, peer, tag](MPI_Comm c, MPI_Request* r) {
                           return MPI_Irecv(st.data(), n, type, peer, tag, c, r);
                         }});
    m->on_complete = [st] { st.unstage(); };
  }
  return m;
}

WorkPtr MpiCommunicator::send_async(Tensor t, int dst, int tag) {
  return enqueue(make_p2p(P2P::send(std::move(t), dst, tag)));
}

WorkPtr MpiCommunicator::recv_async(Tensor t, int src, int tag) {
  return enqueue(make_p2p(P2P::recv(std::move(t), src, tag)));
}

std::vector<WorkPtr> MpiCommunicator::send_recv_async(std::vector<P2P> ops) {
  if (!nccl_rules_ || ops.size() <= 1) return Communicator::send_recv_async(std::move(ops));
  int64_t bytes = 0;
  std::vector<std::shared_ptr<MpiOp>> parts;
  for (const P2P& op : ops) {
    parts.push_back(make_p2p(op));
    bytes += static_cast<int64_t>(op.tensor.nbytes());
  }
  auto m = new_op(name_, size_, timeout_s_, "send_recv",
                  detail::str("send/recv group of ", ops.size(), " transfers"), bytes, true);
  m->parts = std::move(parts);
  return std::vector<WorkPtr>(ops.size(), enqueue(std::move(m)));
}

void MpiCommunicator::follow_nccl_rules() {
  std::lock_guard<std::mutex> lock(mutex_);
  LOOM_CHECK(!worker_.joinable(), "communicator ", name_,
             ": follow_nccl_rules() after the first operation");
  nccl_rules_ = true;
}

WorkPtr MpiCommunicator::barrier_async() {
  auto m = new_op(name_, size_, timeout_s_, "barrier", "collective barrier", 0, true);
  m->phases.push_back(
      {"MPI_Ibarrier", [](MPI_Comm c, MPI_Request* r) { return MPI_Ibarrier(c, r); }});
  return enqueue(std::move(m));
}

WorkPtr MpiCommunicator::enqueue(std::shared_ptr<MpiOp> op) {
  std::shared_ptr<OpState> state = op->state;
  state->event.queued = Clock::now();
  state->waited_ns = waited_ns_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    LOOM_CHECK(!stop_, "communicator ", name_, ": operation issued during destruction");
    queue_.push_back(std::move(op));
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  }
  cv_.notify_all();
  return std::make_shared<MpiWork>(std::move(state));
}

// ---- the worker thread --------------------------------------------------------------------

namespace {

// Polling without progress: yield for a while, then sleep a little longer each time (capped),
// so idle oversubscribed ranks leave the cores to those computing.
void backoff(int idle_polls) {
  if (idle_polls < 64) {
    std::this_thread::yield();
  } else {
    const int shift = std::min(idle_polls - 64, 4);
    std::this_thread::sleep_for(std::chrono::microseconds(10 << shift));
  }
}

bool started_before(const MpiOp& op, Clock::time_point t) {
  std::lock_guard<std::mutex> lock(op.state->mu);
  return op.state->started && op.state->event.started < t;
}

}  // namespace

// Moves queued ops into `active` (in issue order) until a collective is in flight. Returns
// false when the worker should exit: stopping with nothing left, or stopping while unwinding
// or while an op has been in flight past the timeout (then `leaked_` is set and the caller
// abandons what is pending).
bool MpiCommunicator::take_startable(std::vector<std::shared_ptr<MpiOp>>& active,
                                     std::vector<std::shared_ptr<MpiOp>>& to_start) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (active.empty()) cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
  if (stop_) {
    if (queue_.empty() && active.empty()) return false;
    if (abandon_now_) {
      leaked_ = true;
      return false;
    }
    const auto limit = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(timeout_s_));
    for (const auto& op : active) {
      if (started_before(*op, limit)) {
        leaked_ = true;
        return false;
      }
    }
  }
  auto collective_active = [&] {
    return std::any_of(active.begin(), active.end(), [](const auto& op) { return op->collective; });
  };
  while (!queue_.empty() && !collective_active()) {
    active.push_back(queue_.front());
    to_start.push_back(queue_.front());
    queue_.pop_front();
  }
  return true;
}

void MpiCommunicator::finish(MpiOp& op, std::exception_ptr error) {
  OpState& s = *op.state;
  s.event.finished = Clock::now();
  CommObserver observer;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    observer = observer_;
  }
  if (observer) {
    try {
      observer(s.event);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.error = error;
    s.done.store(true, std::memory_order_release);
  }
  s.cv.notify_all();
}

void MpiCommunicator::abandon(std::vector<std::shared_ptr<MpiOp>>& active) {
  std::deque<std::shared_ptr<MpiOp>> queued;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued.swap(queue_);
  }
  for (auto& op : active) queued.push_front(op);
  for (auto& op : queued) {
    const std::string msg =
        detail::str("communicator ", name_, " destroyed while ", op->state->what, " was pending");
    finish(*op, std::make_exception_ptr(Error(msg, __FILE__, __LINE__)));
  }
  // MPI may still write into an abandoned op's buffers, which the op keeps alive: leak them
  // deliberately (this only happens on the way to an aborted job).
  static_cast<void>(new std::deque<std::shared_ptr<MpiOp>>(std::move(queued)));
  active.clear();
}

void MpiCommunicator::worker_loop() {
  std::vector<std::shared_ptr<MpiOp>> active, to_start;
  int idle_polls = 0;
  while (true) {
    if (!take_startable(active, to_start)) {
      if (leaked_) abandon(active);
      return;
    }
    for (auto& op : to_start) {
      std::lock_guard<std::mutex> lock(op->state->mu);
      op->state->started = true;
      op->state->event.started = Clock::now();
    }
    to_start.clear();
    bool advanced = false;
    for (auto it = active.begin(); it != active.end();) {
      std::exception_ptr error;
      MpiOp::Step step = MpiOp::kDone;
      try {
        step = (*it)->progress(comm_);
      } catch (...) {
        error = std::current_exception();
      }
      advanced = advanced || step != MpiOp::kPending;
      if (step == MpiOp::kDone) {
        finish(**it, error);
        it = active.erase(it);
      } else {
        ++it;
      }
    }
    idle_polls = advanced ? 0 : idle_polls + 1;
    if (!advanced) backoff(idle_polls);
  }
}

}  // namespace loom::parallel
