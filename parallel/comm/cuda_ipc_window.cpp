// parallel/comm/cuda_ipc_window.cpp — the CUDA IPC OneSidedWindow (see parallel/comm/one_sided.h)
// for GPUs of one node: each rank's window is its own cudaMalloc, whose IPC handle every member
// opens, so a peer's window is a device pointer. Compiled only in CUDA builds (LOOM_HAS_NCCL);
// COMPILED, NEVER RUN: no GPU was available when it was written (docs/parallel.md, "ODC").
//
// Note [ODC over CUDA IPC]: gets are cudaMemcpyAsync device-to-device from the owner's pointer on
// the window's own copy stream (cudaStreamNonBlocking: the copy engines work while the SMs
// compute), ordered after the calling thread's compute stream by an event, and the returned
// Work, like NcclCommunicator's (Note [NCCL streams and Work]), makes the compute stream wait for
// the copy instead of blocking the host. There is no atomic accumulate through a copy engine, so
// accumulate_async is get-add-put through a staging buffer on the compute stream, which is exact
// only when no other origin writes the same location: ODC uses this window with per-origin slots
// only (OdcGatherer forces its deterministic layout on CUDA tensors). A slot-add kernel writing
// through the peer pointer would save the two copies (a later kernels/cuda/ op). flush and
// barrier synchronise the streams with the host, then the barrier is a host collective over the
// group (its CPU path: MPI). Destruction closes the peer mappings without a barrier: the owner
// of a DataParallel destroys it on every rank at the same point, after the last step's barrier.
#include <cstring>
#include <utility>

#include "core/error.h"
#include "parallel/comm/one_sided.h"

#if LOOM_HAS_NCCL
#include <cuda_runtime.h>

#include <vector>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"
#endif

namespace loom::parallel {

#if LOOM_HAS_NCCL
namespace {

using kernels::cuda::compute_stream;
using kernels::cuda::CudaDeviceGuard;

// Done when its event is; wait() orders the calling thread's compute stream after it.
class CudaEventWork final : public Work {
 public:
  CudaEventWork(cudaEvent_t event, int device) : event_(event), device_(device) {}
  ~CudaEventWork() override { (void)cudaEventDestroy(event_); }
  CudaEventWork(const CudaEventWork&) = delete;
  CudaEventWork& operator=(const CudaEventWork&) = delete;
  void wait() override {
    CudaDeviceGuard guard(device_);
    CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), event_, 0));
  }
  bool is_done() const override {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    CUDA_CHECK(e);
    return true;
  }

 private:
  cudaEvent_t event_;
  int device_;
};

class CudaIpcWindow final : public OneSidedWindow {
 public:
  CudaIpcWindow(Communicator& group, int64_t numel, DType dtype, int device, std::string name)
      : group_(group),
        name_(std::move(name)),
        numel_(numel),
        dtype_(dtype),
        elem_(static_cast<int64_t>(dtype_size(dtype))),
        device_(device) {
    LOOM_CHECK(dtype == DType::kF32 || dtype == DType::kF64, name_,
               ": windows hold f32 or f64, not ", dtype_name(dtype));
    LOOM_CHECK(numel > 0, name_, ": a window needs at least one element, got ", numel);
    CudaDeviceGuard guard(device_);
    CUDA_CHECK(cudaMalloc(&base_, static_cast<size_t>(numel_ * elem_)));
    CUDA_CHECK(cudaMemset(base_, 0, static_cast<size_t>(numel_ * elem_)));
    CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    exchange_handles();
    host_barrier();  // every member's zeroes are in place before anyone accumulates
  }

  ~CudaIpcWindow() override {
    CudaDeviceGuard guard(device_);
    (void)cudaStreamSynchronize(copy_);
    (void)cudaStreamSynchronize(compute_stream());
    for (size_t o = 0; o < peers_.size(); ++o) {
      if (static_cast<int>(o) != group_.rank() && peers_[o] != nullptr)
        (void)cudaIpcCloseMemHandle(peers_[o]);
    }
    (void)cudaStreamDestroy(copy_);
    (void)cudaFree(base_);
  }
  CudaIpcWindow(const CudaIpcWindow&) = delete;
  CudaIpcWindow& operator=(const CudaIpcWindow&) = delete;

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  const std::string& name() const override { return name_; }
  int64_t numel() const override { return numel_; }
  DType dtype() const override { return dtype_; }

  WorkPtr get_async(int owner, int64_t offset, Tensor dst) override {
    check_transfer(owner, offset, dst);
    CudaDeviceGuard guard(device_);
    cudaEvent_t ready = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ready, compute_stream()));  // dst's producers, if any
    CUDA_CHECK(cudaStreamWaitEvent(copy_, ready, 0));
    CUDA_CHECK(cudaEventDestroy(ready));
    CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), peer(owner, offset), dst.nbytes(),
                               cudaMemcpyDeviceToDevice, copy_));
    keep_.push_back(std::move(dst));
    return record(copy_);
  }

  // get-add-put on the compute stream (Note [ODC over CUDA IPC]: per-origin locations only).
  WorkPtr accumulate_async(int owner, int64_t offset, Tensor src) override {
    check_transfer(owner, offset, src);
    CudaDeviceGuard guard(device_);
    Tensor staged = Tensor::empty(src.shape(), dtype_, src.device());
    CUDA_CHECK(cudaMemcpyAsync(staged.raw_data(), peer(owner, offset), src.nbytes(),
                               cudaMemcpyDeviceToDevice, compute_stream()));
    {
      autograd::NoGradGuard no_grad;
      ops::add_(staged, src);
    }
    CUDA_CHECK(cudaMemcpyAsync(peer(owner, offset), staged.raw_data(), src.nbytes(),
                               cudaMemcpyDeviceToDevice, compute_stream()));
    keep_.push_back(std::move(src));
    keep_.push_back(std::move(staged));
    return record(compute_stream());
  }

  void flush() override {
    CudaDeviceGuard guard(device_);
    CUDA_CHECK(cudaStreamSynchronize(copy_));
    CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
    keep_.clear();
  }

  void barrier() override {
    flush();
    host_barrier();
  }

  void write_local(int64_t offset, const Tensor& src) override {
    check_local(offset, src);
    CudaDeviceGuard guard(device_);
    CUDA_CHECK(cudaMemcpyAsync(local(offset), src.raw_data(), src.nbytes(),
                               cudaMemcpyDeviceToDevice, compute_stream()));
  }

  void zero_local(int64_t offset, int64_t n) override {
    check_range(offset, n);
    CudaDeviceGuard guard(device_);
    CUDA_CHECK(cudaMemsetAsync(local(offset), 0, static_cast<size_t>(n * elem_), compute_stream()));
  }

  // Slot 0 copied, the others added in slot order through a staging buffer, one scaling. On the
  // GPU the division is a multiplication by 1/divisor (exact for powers of two).
  void reduce_local(int64_t offset, int64_t stride, int slots, double divisor,
                    const Tensor& out) override {
    LOOM_CHECK(slots >= 1, name_, ": reduce_local over ", slots, " slots");
    check_local(offset, out);
    check_range(offset + (slots - 1) * stride, out.numel());
    CudaDeviceGuard guard(device_);
    autograd::NoGradGuard no_grad;
    Tensor acc = out;
    CUDA_CHECK(cudaMemcpyAsync(acc.raw_data(), local(offset), out.nbytes(),
                               cudaMemcpyDeviceToDevice, compute_stream()));
    Tensor staged = Tensor::empty(out.shape(), dtype_, out.device());
    for (int k = 1; k < slots; ++k) {
      CUDA_CHECK(cudaMemcpyAsync(staged.raw_data(), local(offset + k * stride), out.nbytes(),
                                 cudaMemcpyDeviceToDevice, compute_stream()));
      ops::add_(acc, staged);
    }
    const Tensor scaled = ops::scale(acc, 1.0 / divisor);
    CUDA_CHECK(cudaMemcpyAsync(acc.raw_data(), scaled.raw_data(), out.nbytes(),
                               cudaMemcpyDeviceToDevice, compute_stream()));
    keep_.push_back(staged);  // the stream may still read them
    keep_.push_back(scaled);
  }

 private:
  void exchange_handles() {
    cudaIpcMemHandle_t mine;
    CUDA_CHECK(cudaIpcGetMemHandle(&mine, base_));
    static_assert(sizeof(cudaIpcMemHandle_t) % sizeof(int64_t) == 0);
    const int64_t words = static_cast<int64_t>(sizeof(cudaIpcMemHandle_t) / sizeof(int64_t));
    Tensor in = Tensor::empty({words}, DType::kI64);
    std::memcpy(in.raw_data(), &mine, sizeof(mine));
    Tensor all = Tensor::empty({words * group_.size()}, DType::kI64);
    group_.all_gather(in, all);  // CPU tensors: the group's host path
    peers_.assign(static_cast<size_t>(group_.size()), nullptr);
    for (int o = 0; o < group_.size(); ++o) {
      if (o == group_.rank()) {
        peers_[static_cast<size_t>(o)] = base_;
        continue;
      }
      cudaIpcMemHandle_t h;
      std::memcpy(&h, static_cast<const char*>(all.raw_data()) + o * sizeof(h), sizeof(h));
      const cudaError_t e =
          cudaIpcOpenMemHandle(&peers_[static_cast<size_t>(o)], h, cudaIpcMemLazyEnablePeerAccess);
      LOOM_CHECK(e == cudaSuccess, name_, ": cannot open rank ", o,
                 "'s window (cudaIpcOpenMemHandle: ", cudaGetErrorString(e),
                 "); CUDA IPC windows need every member of ", group_.name(), " on one node");
    }
  }

  void host_barrier() {
    Tensor t = Tensor::zeros({1}, DType::kF32);
    group_.all_reduce(t, ReduceOp::kSum);  // CPU tensor: the group's host (MPI) path
  }

  WorkPtr record(cudaStream_t stream) {
    cudaEvent_t done = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, stream));
    return std::make_shared<CudaEventWork>(done, device_);
  }

  void* peer(int owner, int64_t offset) const {
    return static_cast<char*>(peers_.at(static_cast<size_t>(owner))) + offset * elem_;
  }
  void* local(int64_t offset) const { return static_cast<char*>(base_) + offset * elem_; }

  void check_range(int64_t offset, int64_t n) const {
    LOOM_CHECK(offset >= 0 && n >= 0 && offset + n <= numel_, name_, ": [", offset, ", ",
               offset + n, ") outside the window's ", numel_, " elements");
  }
  void check_tensor(const Tensor& t) const {
    LOOM_CHECK(t.defined() && t.is_contiguous() && t.dtype() == dtype_ && !t.device().is_cpu() &&
                   t.device().index == device_,
               name_, ": transfers take contiguous ", dtype_name(dtype_),
               " tensors on cuda:", device_);
  }
  void check_local(int64_t offset, const Tensor& t) const {
    check_tensor(t);
    check_range(offset, t.numel());
  }
  void check_transfer(int owner, int64_t offset, const Tensor& t) const {
    LOOM_CHECK(owner >= 0 && owner < size(), name_, ": owner ", owner, " outside the group of ",
               size());
    check_local(offset, t);
  }

  Communicator& group_;
  std::string name_;
  int64_t numel_;
  DType dtype_;
  int64_t elem_;
  int device_;
  void* base_ = nullptr;
  cudaStream_t copy_ = nullptr;
  std::vector<void*> peers_;
  std::vector<Tensor> keep_;  // tensors the streams may still read or write, until flush()
};

}  // namespace

std::unique_ptr<OneSidedWindow> make_cuda_ipc_window(Communicator& group, int64_t numel,
                                                     DType dtype, int device, std::string name) {
  return std::make_unique<CudaIpcWindow>(group, numel, dtype, device, std::move(name));
}

#else  // !LOOM_HAS_NCCL

std::unique_ptr<OneSidedWindow> make_cuda_ipc_window(Communicator& group, int64_t, DType, int,
                                                     std::string name) {
  LOOM_FAIL(name, ": ODC on CUDA tensors needs a CUDA build (group ", group.name(), ")");
}

#endif

}  // namespace loom::parallel
