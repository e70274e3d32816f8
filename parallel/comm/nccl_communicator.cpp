// parallel/comm/nccl_communicator.cpp — NcclCommunicator: NCCL calls on the communicator's own
// stream, ordered against the compute stream by events (Note [NCCL streams and Work]), and the
// watchdog thread that completes, times out and aborts operations. Compiled only in CUDA builds
// (CMakeLists.txt); the only CUDA code outside kernels/cuda besides other parallel/comm/nccl*.
// It does not choose devices or build groups (ParallelContext does).
#include "parallel/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"

namespace loom::parallel {

namespace {

using Clock = std::chrono::steady_clock;
using kernels::cuda::compute_stream;
using kernels::cuda::CudaDeviceGuard;

constexpr double kMaxTimeoutS = 1e7;  // keeps deadline arithmetic far from overflow
constexpr auto kPollInterval = std::chrono::milliseconds(1);  // watchdog, while ops are pending

[[noreturn]] void throw_nccl_error(ncclResult_t r, const char* call, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  throw Error(detail::str(call, " failed: ", ncclGetErrorString(r),
                          last != nullptr && *last != '\0' ? detail::str(" (", last, ")") : ""),
              file, line);
}

}  // namespace

// NCCL_CHECK(ncclAllReduce(...)): throws loom::Error naming the call, NCCL's error string and
// file:line when the call does not return ncclSuccess.
#define NCCL_CHECK(call)                                                             \
  do {                                                                               \
    const ncclResult_t loom_nccl_res_ = (call);                                      \
    if (loom_nccl_res_ != ncclSuccess) {                                             \
      ::loom::parallel::throw_nccl_error(loom_nccl_res_, #call, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)

namespace {

// One issued operation, shared by its Work, the pending list and the watchdog.
struct OpRecord {
  std::string what;  // "collective all_reduce", "send to rank 3 (tag 0)"
  CommEvent event;   // group, op, bytes, queued at issue; started/finished by the watchdog
  int device = 0;
  cudaEvent_t start = nullptr, end = nullptr;  // on the communicator's stream
  std::vector<Tensor> tensors;                 // alive until `end` is reached
  std::atomic<bool> done{false};               // completed, or failed
  std::atomic<bool> issued{false};             // the call returned and `end` is recorded
  std::mutex mu;                               // guards error
  std::exception_ptr error;

  OpRecord() = default;
  OpRecord(const OpRecord&) = delete;
  OpRecord& operator=(const OpRecord&) = delete;
  ~OpRecord() {
    if (start != nullptr) (void)cudaEventDestroy(start);
    if (end != nullptr) (void)cudaEventDestroy(end);
  }
  std::exception_ptr get_error() {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
  void set_error(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = std::move(e);
  }
};

class NcclWork final : public Work {
 public:
  explicit NcclWork(std::shared_ptr<OpRecord> op) : op_(std::move(op)) {}

  // Note [NCCL streams and Work]: no host block; the calling thread's compute stream waits.
  void wait() override {
    if (std::exception_ptr e = op_->get_error()) std::rethrow_exception(e);
    CudaDeviceGuard guard(op_->device);
    CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), op_->end, 0));
  }

  bool is_done() const override {
    if (op_->done.load(std::memory_order_acquire)) return true;
    CudaDeviceGuard guard(op_->device);
    const cudaError_t e = cudaEventQuery(op_->end);
    if (e == cudaErrorNotReady) return false;
    CUDA_CHECK(e);
    return true;
  }

 private:
  std::shared_ptr<OpRecord> op_;
};

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_done() const override { return true; }
};

// Byte counts as NCCL's size_t, moved as ncclUint8 (data movement of any dtype).
size_t bytes_of(const Tensor& t) { return t.nbytes(); }

ncclDataType_t reduce_type(DType t, ReduceOp op, const std::string& where) {
  const bool floating =
      t == DType::kF32 || t == DType::kF64 || t == DType::kBF16 || t == DType::kF16;
  LOOM_CHECK(floating || op != ReduceOp::kAvg, where, ": kAvg needs a floating dtype, got ",
             dtype_name(t));
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU32:
      return ncclUint32;
    default:
      LOOM_FAIL(where, ": dtype ", dtype_name(t),
                " not supported for reductions (f32, f64, bf16, f16, i32, i64, u32)");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  LOOM_FAIL("NcclCommunicator: unknown ReduceOp");
}

// True when the byte ranges of a and b overlap.
bool overlaps(const Tensor& a, const Tensor& b) {
  const auto* pa = static_cast<const char*>(a.raw_data());
  const auto* pb = static_cast<const char*>(b.raw_data());
  return a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace

struct NcclCommunicator::Impl {
  std::string name;
  int device = 0;
  double timeout_s = 0;
  int rank = 0, size = 1;
  std::unique_ptr<Communicator> host;

  ncclComm_t comm = nullptr;      // created by the constructor (size > 1) or the first op
  cudaStream_t stream = nullptr;  // non-blocking: ordered against compute by events only
  cudaEvent_t ready = nullptr;    // compute-stream marker, re-recorded at every issue

  std::timed_mutex issue_mu;   // serialises NCCL calls: issuing threads and the watchdog's abort
  std::mutex mu;               // guards everything below
  std::condition_variable cv;  // wakes the watchdog
  std::condition_variable done_cv;                // wakes synchronize()
  std::deque<std::shared_ptr<OpRecord>> pending;  // issued, completion not yet seen (in order)
  CommObserver observer;
  std::exception_ptr failed;  // set when the communicator was aborted
  bool aborted = false;
  bool stop = false;
  bool abandon = false;  // destroyed while unwinding: do not wait
  std::thread watchdog;

  std::string where(const char* op) const { return detail::str(op, " on group ", name); }
  Communicator& host_comm(const char* op) const {
    LOOM_CHECK(host != nullptr, where(op),
               ": CPU tensors need a host communicator, and this group of one has none");
    return *host;
  }
  void check_cuda(const Tensor& t, const char* op, const char* arg) const {
    LOOM_CHECK(t.defined(), where(op), ": ", arg, " is undefined");
    LOOM_CHECK(t.device() == Device::cuda(device), where(op), ": ", arg, " is on ",
               t.device().str(), "; this communicator serves cuda:", device);
    LOOM_CHECK(t.is_contiguous(), where(op), ": ", arg, " must be contiguous");
  }
  // The checks of one CUDA transfer, at issue time (defined below).
  void check_p2p(const P2P& op) const;
  // Both tensors on the host (→ true) or both on this GPU (→ false).
  bool both_on_host(const Tensor& in, const Tensor& out, const char* op) const {
    LOOM_CHECK(in.defined() && out.defined(), where(op), ": in and out must be defined");
    const bool cpu = in.device().is_cpu();
    LOOM_CHECK(cpu == out.device().is_cpu(), where(op), ": in is on ", in.device().str(),
               ", out on ", out.device().str());
    if (!cpu) {
      check_cuda(in, op, "in");
      check_cuda(out, op, "out");
    }
    return cpu;
  }

  void create_stream() {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  }

  // Member 0's unique id, broadcast through the host communicator; then every member joins.
  void bootstrap() {
    constexpr int64_t kIdWords = (sizeof(ncclUniqueId) + 3) / 4;
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    Tensor buf = Tensor::zeros({kIdWords}, DType::kI32);
    if (rank == 0) {
      NCCL_CHECK(ncclGetUniqueId(&id));
      std::memcpy(buf.raw_data(), &id, sizeof(id));
    }
    host->broadcast(buf, 0);
    std::memcpy(&id, buf.raw_data(), sizeof(id));
    CudaDeviceGuard guard(device);
    create_stream();
    NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
  }

  // A group of one: its communicator is made on first use (callers hold issue_mu).
  void ensure_comm() {
    if (comm != nullptr) return;
    CudaDeviceGuard guard(device);
    if (stream == nullptr) create_stream();
    NCCL_CHECK(ncclCommInitAll(&comm, 1, &device));
  }

  void throw_if_failed() {
    std::lock_guard<std::mutex> lock(mu);
    if (failed) std::rethrow_exception(failed);
  }

  // Issues one operation (Note [NCCL streams and Work]). `call` enqueues the NCCL work on the
  // given communicator and stream.
  WorkPtr launch(const char* op, std::string what, int64_t bytes, std::vector<Tensor> tensors,
                 const std::function<void(ncclComm_t, cudaStream_t)>& call) {
    std::lock_guard<std::timed_mutex> issue(issue_mu);
    throw_if_failed();
    ensure_comm();
    CudaDeviceGuard guard(device);
    auto rec = std::make_shared<OpRecord>();
    rec->what = std::move(what);
    rec->device = device;
    rec->event.group = name;
    rec->event.op = op;
    rec->event.bytes = bytes;
    rec->event.queued = Clock::now();
    rec->tensors = std::move(tensors);
    CUDA_CHECK(cudaEventCreate(&rec->start));
    CUDA_CHECK(cudaEventCreate(&rec->end));
    CUDA_CHECK(cudaEventRecord(ready, compute_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(stream, ready, 0));
    CUDA_CHECK(cudaEventRecord(rec->start, stream));
    {
      // Pending before the call: an NCCL call can block the host until its peers reach it (the
      // first transfer between two ranks connects them), so a peer that never comes is timed
      // out by the watchdog like a kernel that never ends.
      std::lock_guard<std::mutex> lock(mu);
      pending.push_back(rec);
      if (!watchdog.joinable()) watchdog = std::thread([this] { watchdog_loop(); });
    }
    cv.notify_all();
    try {
      call(comm, stream);
    } catch (const std::exception& e) {
      // Part of the work may be queued (a copy, one side of a group): the record stays pending,
      // holding its tensors until `end`, and the group is failed, since the ranks' sequences of
      // operations no longer match.
      if (cudaEventRecord(rec->end, stream) != cudaSuccess) (void)cudaGetLastError();
      rec->issued.store(true, std::memory_order_release);
      fail(detail::str(rec->what, " on group ", name, " failed when issued: ", e.what()), true);
      throw;
    }
    CUDA_CHECK(cudaEventRecord(rec->end, stream));
    rec->issued.store(true, std::memory_order_release);
    return std::make_shared<NcclWork>(std::move(rec));
  }

  void watchdog_loop();
  void complete(OpRecord& op);
  // holding_issue: the caller is the issuing thread, inside launch() (it holds issue_mu).
  void fail(const std::string& message, bool holding_issue = false);
};

// ---- the watchdog -------------------------------------------------------------------------

void NcclCommunicator::Impl::complete(OpRecord& op) {
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, op.start, op.end) != cudaSuccess) {
    (void)cudaGetLastError();
    ms = 0.0f;
  }
  op.event.finished = Clock::now();
  op.event.started = op.event.finished - std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double, std::milli>(ms));
  CommObserver obs;
  {
    std::lock_guard<std::mutex> lock(mu);
    obs = observer;
  }
  if (obs && !op.get_error()) {
    try {
      obs(op.event);
    } catch (...) {
      op.set_error(std::current_exception());
    }
  }
  op.tensors.clear();  // the GPU is done with them (Note [NCCL streams and Work])
  op.done.store(true, std::memory_order_release);
}

// Fails every pending operation with `message` (the first) or as aborted behind it, makes the
// communicator unusable and aborts the NCCL communicator, which ends its stuck kernels.
void NcclCommunicator::Impl::fail(const std::string& message, bool holding_issue) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) return;
    aborted = true;
    failed = std::make_exception_ptr(Error(message, __FILE__, __LINE__));
    bool first = true;
    for (auto& op : pending) {
      op->set_error(first ? failed
                          : std::make_exception_ptr(
                                Error(detail::str(op->what, " on group ", name,
                                                  " was aborted with the communicator: ", message),
                                      __FILE__, __LINE__)));
      op->done.store(true, std::memory_order_release);
      first = false;
    }
  }
  std::fprintf(stderr, "NcclCommunicator: %s\n", message.c_str());
  std::fflush(stderr);
  // An issuing thread stuck inside NCCL would hold issue_mu: abort anyway after a second.
  const bool locked = holding_issue || issue_mu.try_lock_for(std::chrono::seconds(1));
  if (comm != nullptr) (void)ncclCommAbort(comm);
  if (locked) {  // otherwise an issuing thread may still read `comm`: `aborted` marks it dead
    comm = nullptr;
    if (!holding_issue) issue_mu.unlock();
  }
  done_cv.notify_all();
}

void NcclCommunicator::Impl::watchdog_loop() {
  if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
  std::unique_lock<std::mutex> lock(mu);
  while (true) {
    if (pending.empty() || (stop && (abandon || aborted))) {
      if (stop) return;
      cv.wait(lock, [&] { return stop || !pending.empty(); });
      continue;
    }
    std::shared_ptr<OpRecord> op = pending.front();
    const bool was_aborted = aborted;
    lock.unlock();
    std::string failure;
    bool finished = false;
    try {
      // Not yet issued: still inside its NCCL call (only the timeout applies).
      const cudaError_t e =
          op->issued.load(std::memory_order_acquire) ? cudaEventQuery(op->end) : cudaErrorNotReady;
      if (e == cudaSuccess) {
        complete(*op);
        finished = true;
      } else if (e != cudaErrorNotReady) {
        (void)cudaGetLastError();
        failure = detail::str(op->what, " on group ", name, " (", size,
                              " ranks) failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
      } else if (!was_aborted) {
        ncclResult_t async = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
        const double waited =
            std::chrono::duration<double>(Clock::now() - op->event.queued).count();
        if (async != ncclSuccess && async != ncclInProgress) {
          failure = detail::str(
              op->what, " on group ", name, " (", size,
              " ranks): NCCL reported an asynchronous error: ", ncclGetErrorString(async));
        } else if (waited > timeout_s) {
          failure = detail::str(op->what, " on group ", name, " (", size,
                                " ranks) did not complete within ", timeout_s,
                                " s (the NCCL communicator was aborted; the group is unusable)");
        }
      }
    } catch (const std::exception& ex) {
      failure = detail::str(op->what, " on group ", name, ": watchdog error: ", ex.what());
    }
    if (!failure.empty() && !was_aborted) fail(failure);
    lock.lock();
    if (finished) {
      pending.pop_front();
      done_cv.notify_all();
    } else {
      cv.wait_for(lock, kPollInterval, [&] { return stop && (abandon || aborted); });
    }
  }
}

// ---- construction -------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(std::string name, int device_index,
                                   std::unique_ptr<Communicator> host, double timeout_s)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.name = std::move(name);
  m.device = device_index;
  LOOM_CHECK(timeout_s > 0, "NcclCommunicator ", m.name, ": timeout must be > 0 s, got ",
             timeout_s);
  m.timeout_s = std::min(timeout_s, kMaxTimeoutS);
  m.host = std::move(host);
  if (m.host) {
    m.rank = m.host->rank();
    m.size = m.host->size();
  }
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  LOOM_CHECK(device_index >= 0 && device_index < count, "NcclCommunicator ", m.name,
             ": cuda:", device_index, " does not exist (", count, " GPUs visible)");
  if (m.size > 1) m.bootstrap();
}

NcclCommunicator::~NcclCommunicator() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stop = true;
    m.abandon = std::uncaught_exceptions() > 0;
  }
  m.cv.notify_all();
  if (m.watchdog.joinable()) m.watchdog.join();
  if (!m.pending.empty()) {
    // Unwinding, or aborted with operations whose kernels never ended: the GPU may still use
    // their tensors, so leak them rather than let the allocator reuse the memory.
    if (m.comm != nullptr && !m.aborted) (void)ncclCommAbort(m.comm);
    m.comm = nullptr;
    static_cast<void>(new std::deque<std::shared_ptr<OpRecord>>(std::move(m.pending)));
  }
  if (m.comm != nullptr && !m.aborted) (void)ncclCommDestroy(m.comm);  // an aborted one is gone
  if (m.ready != nullptr) (void)cudaEventDestroy(m.ready);
  if (m.stream != nullptr) (void)cudaStreamDestroy(m.stream);
  (void)cudaGetLastError();
}

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }
const std::string& NcclCommunicator::name() const { return impl_->name; }
int NcclCommunicator::device_index() const { return impl_->device; }
double NcclCommunicator::timeout_s() const { return impl_->timeout_s; }

void NcclCommunicator::set_observer(CommObserver observer) {
  if (impl_->host) impl_->host->set_observer(observer);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->observer = std::move(observer);
}

void NcclCommunicator::synchronize() {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  if (!m.pending.empty()) {
    std::shared_ptr<OpRecord> last = m.pending.back();
    m.done_cv.wait(lock, [&] { return m.aborted || last->done.load(); });
    lock.unlock();
    if (std::exception_ptr e = last->get_error()) std::rethrow_exception(e);
    lock.lock();
  }
  if (m.failed) std::rethrow_exception(m.failed);
}

// ---- operations ---------------------------------------------------------------------------

WorkPtr NcclCommunicator::all_reduce_async(Tensor t, ReduceOp op) {
  Impl& m = *impl_;
  LOOM_CHECK(t.defined(), m.where("all_reduce"), ": t is undefined");
  if (t.device().is_cpu()) return m.host_comm("all_reduce").all_reduce_async(std::move(t), op);
  m.check_cuda(t, "all_reduce", "t");
  const ncclDataType_t type = reduce_type(t.dtype(), op, m.where("all_reduce"));
  const size_t n = static_cast<size_t>(t.numel());
  void* p = t.raw_data();
  return m.launch("all_reduce", "collective all_reduce", static_cast<int64_t>(t.nbytes()), {t},
                  [=](ncclComm_t c, cudaStream_t s) {
                    if (n > 0) NCCL_CHECK(ncclAllReduce(p, p, n, type, nccl_op(op), c, s));
                  });
}

WorkPtr NcclCommunicator::reduce_scatter_async(Tensor in, Tensor out, ReduceOp op) {
  Impl& m = *impl_;
  if (m.both_on_host(in, out, "reduce_scatter")) {
    return m.host_comm("reduce_scatter").reduce_scatter_async(std::move(in), std::move(out), op);
  }
  const std::string where = m.where("reduce_scatter");
  LOOM_CHECK(in.dtype() == out.dtype(), where, ": in is ", dtype_name(in.dtype()), ", out is ",
             dtype_name(out.dtype()));
  LOOM_CHECK(in.numel() == m.size * out.numel(), where, ": in has ", in.numel(),
             " elements, expected size ", m.size, " x out ", out.numel());
  const ncclDataType_t type = reduce_type(in.dtype(), op, where);
  // In place only as NCCL allows it: out is this rank's chunk of in.
  LOOM_CHECK(
      !overlaps(in, out) || static_cast<const char*>(out.raw_data()) ==
                                static_cast<const char*>(in.raw_data()) + m.rank * out.nbytes(),
      where, ": out overlaps in other than as this rank's chunk");
  const size_t n = static_cast<size_t>(out.numel());
  const void* src = in.raw_data();
  void* dst = out.raw_data();
  return m.launch("reduce_scatter", "collective reduce_scatter", static_cast<int64_t>(in.nbytes()),
                  {in, out}, [=](ncclComm_t c, cudaStream_t s) {
                    if (n > 0) NCCL_CHECK(ncclReduceScatter(src, dst, n, type, nccl_op(op), c, s));
                  });
}

WorkPtr NcclCommunicator::all_gather_async(Tensor in, Tensor out) {
  Impl& m = *impl_;
  if (m.both_on_host(in, out, "all_gather")) {
    return m.host_comm("all_gather").all_gather_async(std::move(in), std::move(out));
  }
  const std::string where = m.where("all_gather");
  LOOM_CHECK(in.dtype() == out.dtype(), where, ": in is ", dtype_name(in.dtype()), ", out is ",
             dtype_name(out.dtype()));
  LOOM_CHECK(out.numel() == m.size * in.numel(), where, ": out has ", out.numel(),
             " elements, expected size ", m.size, " x in ", in.numel());
  LOOM_CHECK(
      !overlaps(in, out) || static_cast<const char*>(in.raw_data()) ==
                                static_cast<const char*>(out.raw_data()) + m.rank * in.nbytes(),
      where, ": in overlaps out other than as this rank's chunk");
  const size_t nbytes = bytes_of(in);
  const void* src = in.raw_data();
  void* dst = out.raw_data();
  return m.launch("all_gather", "collective all_gather", static_cast<int64_t>(out.nbytes()),
                  {in, out}, [=](ncclComm_t c, cudaStream_t s) {
                    if (nbytes > 0) NCCL_CHECK(ncclAllGather(src, dst, nbytes, ncclUint8, c, s));
                  });
}

WorkPtr NcclCommunicator::all_to_all_async(Tensor in, Tensor out) {
  Impl& m = *impl_;
  if (m.both_on_host(in, out, "all_to_all")) {
    return m.host_comm("all_to_all").all_to_all_async(std::move(in), std::move(out));
  }
  const std::string where = m.where("all_to_all");
  LOOM_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel(), where,
             ": in and out must have the same dtype and size, got ", dtype_name(in.dtype()), " ",
             in.numel(), " and ", dtype_name(out.dtype()), " ", out.numel());
  LOOM_CHECK(in.numel() % m.size == 0, where, ": ", in.numel(), " elements do not split into ",
             m.size, " equal chunks");
  LOOM_CHECK(!overlaps(in, out), where, ": in and out overlap");
  const size_t chunk = bytes_of(in) / static_cast<size_t>(m.size);
  const char* src = static_cast<const char*>(in.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  const int size = m.size, rank = m.rank;
  return m.launch(
      "all_to_all", "collective all_to_all", static_cast<int64_t>(in.nbytes()), {in, out},
      [=](ncclComm_t c, cudaStream_t s) {
        if (chunk == 0) return;
        const size_t me = static_cast<size_t>(rank) * chunk;
        CUDA_CHECK(cudaMemcpyAsync(dst + me, src + me, chunk, cudaMemcpyDeviceToDevice, s));
        if (size == 1) return;
        NCCL_CHECK(ncclGroupStart());
        try {
          for (int j = 0; j < size; ++j) {
            if (j == rank) continue;
            const size_t off = static_cast<size_t>(j) * chunk;
            NCCL_CHECK(ncclSend(src + off, chunk, ncclUint8, j, c, s));
            NCCL_CHECK(ncclRecv(dst + off, chunk, ncclUint8, j, c, s));
          }
        } catch (...) {
          (void)ncclGroupEnd();
          throw;
        }
        NCCL_CHECK(ncclGroupEnd());
      });
}

WorkPtr NcclCommunicator::broadcast_async(Tensor t, int root) {
  Impl& m = *impl_;
  LOOM_CHECK(t.defined(), m.where("broadcast"), ": t is undefined");
  if (t.device().is_cpu()) return m.host_comm("broadcast").broadcast_async(std::move(t), root);
  m.check_cuda(t, "broadcast", "t");
  LOOM_CHECK(root >= 0 && root < m.size, m.where("broadcast"), ": root ", root,
             " out of range [0, ", m.size, ")");
  const size_t nbytes = bytes_of(t);
  void* p = t.raw_data();
  return m.launch("broadcast", "collective broadcast", static_cast<int64_t>(t.nbytes()), {t},
                  [=](ncclComm_t c, cudaStream_t s) {
                    if (nbytes > 0) NCCL_CHECK(ncclBroadcast(p, p, nbytes, ncclUint8, root, c, s));
                  });
}

namespace {

// "send to rank 3 (tag 5)" / "recv from rank 3 (tag 5)".
std::string p2p_what(const P2P& op) {
  return op.kind == P2P::Kind::kSend
             ? detail::str("send to rank ", op.peer, " (tag ", op.tag, ")")
             : detail::str("recv from rank ", op.peer, " (tag ", op.tag, ")");
}

// Enqueues one transfer (inside or outside a group) on communicator c, stream s.
void enqueue_p2p(const P2P& op, ncclComm_t c, cudaStream_t s) {
  const size_t nbytes = bytes_of(op.tensor);
  if (nbytes == 0) return;
  if (op.kind == P2P::Kind::kSend) {
    NCCL_CHECK(ncclSend(op.tensor.raw_data(), nbytes, ncclUint8, op.peer, c, s));
  } else {
    NCCL_CHECK(ncclRecv(op.tensor.raw_data(), nbytes, ncclUint8, op.peer, c, s));
  }
}

}  // namespace

// The checks of one CUDA transfer, at issue time.
void NcclCommunicator::Impl::check_p2p(const P2P& op) const {
  const std::string where = p2p_what(op) + " on group " + name;
  check_cuda(op.tensor, op.kind == P2P::Kind::kSend ? "send" : "recv", "t");
  LOOM_CHECK(op.peer >= 0 && op.peer < size && op.peer != rank, where,
             ": peer must be another rank in [0, ", size, ")");
  LOOM_CHECK(op.tag >= 0 && op.tag <= 32767, where, ": tag must be in [0, 32767]");
}

WorkPtr NcclCommunicator::send_async(Tensor t, int dst, int tag) {
  return std::move(send_recv_async({P2P::send(std::move(t), dst, tag)}).front());
}

WorkPtr NcclCommunicator::recv_async(Tensor t, int src, int tag) {
  return std::move(send_recv_async({P2P::recv(std::move(t), src, tag)}).front());
}

std::vector<WorkPtr> NcclCommunicator::send_recv_async(std::vector<P2P> ops) {
  Impl& m = *impl_;
  if (ops.empty()) return {};
  size_t on_host = 0;
  for (const P2P& op : ops) {
    LOOM_CHECK(op.tensor.defined(), p2p_what(op), " on group ", m.name, ": t is undefined");
    on_host += op.tensor.device().is_cpu() ? 1 : 0;
  }
  if (on_host == ops.size()) return m.host_comm("send/recv").send_recv_async(std::move(ops));
  LOOM_CHECK(on_host == 0, m.where("send/recv"), ": a group mixes CPU and CUDA tensors");
  for (const P2P& op : ops) m.check_p2p(op);
  if (ops.size() == 1) {
    const P2P& op = ops.front();
    WorkPtr w = m.launch(op.kind == P2P::Kind::kSend ? "send" : "recv", p2p_what(op),
                         static_cast<int64_t>(op.tensor.nbytes()), {op.tensor},
                         [op](ncclComm_t c, cudaStream_t s) { enqueue_p2p(op, c, s); });
    return {w};
  }
  int64_t bytes = 0;
  std::vector<Tensor> tensors;
  for (const P2P& op : ops) {
    bytes += static_cast<int64_t>(op.tensor.nbytes());
    tensors.push_back(op.tensor);
  }
  WorkPtr w = m.launch("send_recv", detail::str("send/recv group of ", ops.size(), " transfers"),
                       bytes, std::move(tensors), [&ops](ncclComm_t c, cudaStream_t s) {
                         NCCL_CHECK(ncclGroupStart());
                         try {
                           for (const P2P& op : ops) enqueue_p2p(op, c, s);
                         } catch (...) {
                           (void)ncclGroupEnd();
                           throw;
                         }
                         NCCL_CHECK(ncclGroupEnd());
                       });
  return std::vector<WorkPtr>(ops.size(), w);
}

WorkPtr NcclCommunicator::barrier_async() {
  Impl& m = *impl_;
  m.throw_if_failed();
  if (m.host) return m.host->barrier_async();
  return std::make_shared<DoneWork>();
}

}  // namespace loom::parallel
