// parallel/parallel_context.cpp — builds a rank's communicators from the mesh (collectively
// over MPI_COMM_WORLD; NCCL ones over the MPI ones for a CUDA device), and the size-1
// in-process communicator used without MPI. Creates groups only; the collectives themselves
// live in parallel/comm/.
#include "parallel/parallel_context.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#if LOOM_HAS_MPI
#include <mpi.h>

#include "parallel/comm/mpi_communicator.h"
#endif
#if LOOM_HAS_NCCL
#include "parallel/comm/nccl_communicator.h"
#endif

namespace loom::parallel {

namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_done() const override { return true; }
};

// A group of one process, without MPI: every collective is the identity (or a copy from in
// to out) and completes before returning. send/recv would need a peer, so they throw.
class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  void set_observer(CommObserver observer) override { observer_ = std::move(observer); }

  WorkPtr all_reduce_async(Tensor t, ReduceOp) override {
    check(t, "all_reduce");
    return done("all_reduce", t.nbytes());
  }
  WorkPtr reduce_scatter_async(Tensor in, Tensor out, ReduceOp) override {
    return copy(in, out, "reduce_scatter");
  }
  WorkPtr all_gather_async(Tensor in, Tensor out) override { return copy(in, out, "all_gather"); }
  WorkPtr all_to_all_async(Tensor in, Tensor out) override { return copy(in, out, "all_to_all"); }
  WorkPtr broadcast_async(Tensor t, int root) override {
    check(t, "broadcast");
    LOOM_CHECK(root == 0, "broadcast on group ", name_, ": root ", root, " out of range [0, 1)");
    return done("broadcast", t.nbytes());
  }
  WorkPtr send_async(Tensor, int dst, int) override {
    LOOM_FAIL("send to rank ", dst, " on group ", name_, ": a single-process group has no peer");
  }
  WorkPtr recv_async(Tensor, int src, int) override {
    LOOM_FAIL("recv from rank ", src, " on group ", name_, ": a single-process group has no peer");
  }
  WorkPtr barrier_async() override { return done("barrier", 0); }

 private:
  void check(const Tensor& t, const char* op) const {
    LOOM_CHECK(t.defined() && t.device().is_cpu() && t.is_contiguous(), op, " on group ", name_,
               ": tensors must be defined, contiguous and on the CPU");
  }
  WorkPtr copy(const Tensor& in, const Tensor& out, const char* op) {
    check(in, op);
    check(out, op);
    LOOM_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel(), op, " on group ", name_,
               ": in and out must have the same dtype and size on a group of one");
    if (in.numel() > 0 && in.raw_data() != out.raw_data()) {
      std::memcpy(out.raw_data(), in.raw_data(), in.nbytes());
    }
    return done(op, in.nbytes());
  }
  WorkPtr done(const char* op, size_t bytes) {
    if (observer_) {
      CommEvent e;
      e.group = name_;
      e.op = op;
      e.bytes = static_cast<int64_t>(bytes);
      e.queued = e.started = e.finished = std::chrono::steady_clock::now();
      observer_(e);
    }
    return std::make_shared<DoneWork>();
  }

  std::string name_;
  CommObserver observer_;
};

// For a CUDA device, `host` wrapped in an NcclCommunicator on that GPU (collective over the
// group's members); else `host` itself.
std::unique_ptr<Communicator> on_device(std::unique_ptr<Communicator> host, Device device,
                                        double timeout_s) {
  if (device.is_cpu()) return host;
#if LOOM_HAS_NCCL
  const int gpus = device_count(DeviceType::kCuda);
  LOOM_CHECK(device.index >= 0 && device.index < gpus, "ParallelContext: ", device.str(),
             " is not available (", gpus, " GPUs visible)");
  std::string name = host->name();
  return std::make_unique<NcclCommunicator>(std::move(name), device.index, std::move(host),
                                            timeout_s);
#else
  (void)timeout_s;
  LOOM_FAIL("ParallelContext: device ", device.str(),
            " needs NCCL, and this build has no CUDA (configure with -DLOOM_CUDA=ON)");
#endif
}

}  // namespace

ParallelContext::ParallelContext(DeviceMesh mesh, int rank, Device device)
    : mesh_(std::move(mesh)), rank_(rank), coords_(mesh_.coords(rank)), device_(device) {}

ParallelContext::ParallelContext(ParallelContext&&) noexcept = default;
ParallelContext& ParallelContext::operator=(ParallelContext&&) noexcept = default;
ParallelContext::~ParallelContext() = default;

double default_comm_timeout_s() {
  const char* env = std::getenv("LOOM_COMM_TIMEOUT_S");
  if (env == nullptr || *env == '\0') return 300.0;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  LOOM_CONFIG_CHECK(end != env && *end == '\0' && v > 0 && std::isfinite(v),
                    "LOOM_COMM_TIMEOUT_S: expected a positive number of seconds, got '", env, "'");
  return v;
}

ParallelContext ParallelContext::create(const ParallelOptions& options) {
#if !LOOM_HAS_MPI
  (void)options;
  LOOM_FAIL("ParallelContext::create: this build has no MPI (configure with -DLOOM_MPI=ON)");
#else
  int initialized = 0;
  MPI_Initialized(&initialized);
  LOOM_CHECK(initialized,
             "ParallelContext::create: MPI is not initialised (use MpiRuntime or run_main)");
  int rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  DeviceMesh mesh(options.shape, world_size, options.order);
  const int partition = options.mics_partition_size == 0 ? options.shape.dp * options.shape.cp
                                                         : options.mics_partition_size;
  mesh.check_mics_partition_size(partition);
  const double timeout =
      options.comm_timeout_s > 0 ? options.comm_timeout_s : default_comm_timeout_s();

  Device device = Device::cpu();
  if (options.device == DeviceType::kCuda) {
    // The node-local rank picks the GPU: one GPU per rank (NCCL puts no two members of a group
    // on one GPU; several ranks sharing a GPU use the MPI communicators with CPU device).
    MPI_Comm node = MPI_COMM_NULL;
    int local_rank = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_free(&node);
    const int gpus = device_count(DeviceType::kCuda);
    LOOM_CHECK(local_rank < gpus, "ParallelContext: rank ", rank, " is local rank ", local_rank,
               " on its node, but only ", gpus,
               " GPUs are visible (a CUDA run needs one GPU per rank)");
    device = Device::cuda(local_rank);
    set_current_device(device);  // before any CUDA call of this rank makes a context elsewhere
  }

  ParallelContext ctx(std::move(mesh), rank, device);
  auto world = MpiCommunicator::duplicate(MPI_COMM_WORLD, "world", timeout);
  const MPI_Comm parent = world->mpi_comm();
  // Every rank creates its groups in this same order; each kind has its own tag. The MPI
  // groups all exist before the first NCCL bootstrap.
  int tag = 1;
  for (MeshDim d : {MeshDim::kTp, MeshDim::kCp, MeshDim::kDp, MeshDim::kPp}) {
    ctx.dims_[static_cast<int>(d)] = MpiCommunicator::create(
        parent, ctx.mesh_.group_members(rank, d), mesh_dim_name(d), timeout, tag++);
  }
  ctx.mics_partition_ = MpiCommunicator::create(
      parent, ctx.mesh_.mics_partition_group(rank, partition), "mics_partition", timeout, tag++);
  ctx.mics_replica_ = MpiCommunicator::create(parent, ctx.mesh_.mics_replica_group(rank, partition),
                                              "mics_replica", timeout, tag++);
  ctx.dp_cp_ =
      MpiCommunicator::create(parent, ctx.mesh_.dp_cp_group(rank), "dp_cp", timeout, tag++);
  if (options.nccl_rules) {
    world->follow_nccl_rules();
    for (auto& c : ctx.dims_) static_cast<MpiCommunicator&>(*c).follow_nccl_rules();
    for (auto* c : {&ctx.mics_partition_, &ctx.mics_replica_, &ctx.dp_cp_}) {
      static_cast<MpiCommunicator&>(**c).follow_nccl_rules();
    }
  }
  ctx.world_ = on_device(std::move(world), device, timeout);
  for (auto& c : ctx.dims_) c = on_device(std::move(c), device, timeout);
  ctx.mics_partition_ = on_device(std::move(ctx.mics_partition_), device, timeout);
  ctx.mics_replica_ = on_device(std::move(ctx.mics_replica_), device, timeout);
  ctx.dp_cp_ = on_device(std::move(ctx.dp_cp_), device, timeout);
  return ctx;
#endif
}

ParallelContext ParallelContext::single_process(Device device) {
  ParallelContext ctx(DeviceMesh(MeshShape{}, 1), 0, device);
  const double timeout = device.is_cpu() ? 0.0 : default_comm_timeout_s();
  auto make = [&](const char* name) {
    return on_device(std::make_unique<SelfCommunicator>(name), device, timeout);
  };
  ctx.world_ = make("world");
  for (MeshDim d : {MeshDim::kTp, MeshDim::kCp, MeshDim::kDp, MeshDim::kPp}) {
    ctx.dims_[static_cast<int>(d)] = make(mesh_dim_name(d));
  }
  ctx.mics_partition_ = make("mics_partition");
  ctx.mics_replica_ = make("mics_replica");
  ctx.dp_cp_ = make("dp_cp");
  return ctx;
}

Communicator& ParallelContext::group(MeshDim d) const { return *dims_[static_cast<int>(d)]; }

void ParallelContext::set_observer(const CommObserver& observer) {
  world_->set_observer(observer);
  for (auto& c : dims_) c->set_observer(observer);
  mics_partition_->set_observer(observer);
  mics_replica_->set_observer(observer);
  dp_cp_->set_observer(observer);
}

std::string ParallelContext::str() const {
  return detail::str("rank ", rank_, " of ", world_size(), ": dp=", coords_.dp, " pp=", coords_.pp,
                     " cp=", coords_.cp, " tp=", coords_.tp, " (mesh ", mesh_.str(), ")");
}

}  // namespace loom::parallel
