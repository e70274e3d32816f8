// parallel/parallel_context.cpp — builds a rank's communicators from the mesh (collectively
// over MPI_COMM_WORLD; NCCL ones over the MPI ones for a CUDA device), and the size-1
// in-process communicator used without MPI. Creates groups only; the collectives themselves
// live in parallel/comm/.
#include "parallel/parallel_context.h"

#include <algorithm>
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

// The groups every context has beyond the world and the single axes (Note in the header), and
// the MiCS split: (axes, name, member function) in creation order.
struct GroupSpec {
  Axes axes;
  std::string name;
  std::vector<int> members;
};

std::vector<GroupSpec> group_specs(const DeviceMesh& mesh, int rank,
                                   const ParallelOptions& options) {
  std::vector<GroupSpec> out;
  for (const MeshAxis& a : mesh.axes())
    out.push_back({{a.name}, a.name, mesh.group_members(rank, {a.name})});
  const Axes dp_cp = {kAxisDp, kAxisCp};
  out.push_back({dp_cp, "dp_cp", mesh.group_members(rank, dp_cp)});
  int partition = 1;
  for (const std::string& a : dp_cp) partition *= mesh.size(a);
  if (options.mics_partition_size != 0) partition = options.mics_partition_size;
  out.push_back(
      {{kAxisMicsPartition}, kAxisMicsPartition, mesh.partition_group(rank, dp_cp, partition)});
  out.push_back({{kAxisMicsReplica}, kAxisMicsReplica, mesh.replica_group(rank, dp_cp, partition)});
  // Note [Hybrid context parallelism] in parallel/cp/hybrid.h.
  const int u = std::max(1, options.cp_ulysses);
  LOOM_CONFIG_CHECK(mesh.size(kAxisCp) % u == 0, "parallel.cp_ulysses: ", u,
                    " does not divide parallel.cp ", mesh.size(kAxisCp));
  out.push_back({{kAxisCpUlysses}, kAxisCpUlysses, mesh.partition_group(rank, {kAxisCp}, u)});
  out.push_back({{kAxisCpRing}, kAxisCpRing, mesh.replica_group(rank, {kAxisCp}, u)});
  for (const Axes& axes : options.groups) {
    std::string name;
    for (const std::string& a : axes) name += (name.empty() ? "" : "_") + a;
    out.push_back({axes, name, mesh.group_members(rank, axes)});
  }
  return out;
}

[[maybe_unused]] DeviceMesh mesh_of(const ParallelOptions& options, int world_size) {
  if (options.axes.empty()) return DeviceMesh(options.shape, world_size, options.order);
  DeviceMesh mesh(options.axes, world_size);
  for (const char* a : {kAxisTp, kAxisCp, kAxisDp, kAxisPp}) {
    LOOM_CHECK(mesh.has_axis(a), "ParallelOptions::axes: the engine's axis '", a,
               "' is missing (give it size 1)");
  }
  return mesh;
}

}  // namespace

ParallelContext::ParallelContext(DeviceMesh mesh, int rank, Device device)
    : mesh_(std::move(mesh)), rank_(rank), device_(device) {}

std::string ParallelContext::key(Axes axes) {
  std::sort(axes.begin(), axes.end());
  std::string k;
  for (const std::string& a : axes) k += (k.empty() ? "" : "+") + a;
  return k;
}

void ParallelContext::add(const Axes& axes, std::unique_ptr<Communicator> comm) {
  groups_.emplace(key(axes), std::move(comm));  // a repeated set keeps its first communicator
}

Communicator& ParallelContext::group(const Axes& axes) const {
  auto it = groups_.find(key(axes));
  if (it == groups_.end()) {
    std::string known;
    for (const auto& [k, c] : groups_) known += (known.empty() ? "" : ", ") + k;
    LOOM_FAIL("ParallelContext: no group along {", key(axes),
              "} was created (ParallelOptions::groups adds one); groups: ", known);
  }
  return *it->second;
}

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
  DeviceMesh mesh = mesh_of(options, world_size);
  const std::vector<GroupSpec> specs = group_specs(mesh, rank, options);
  const HostMap hosts = host_map();  // collective; the same on every rank
  check_tp_inside_hosts(hosts, mesh, options.tp_across_hosts);
  std::string topology = describe_topology(hosts, group_kinds(mesh, options.mics_partition_size),
                                           options.mics_partition_size > 0);
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
  ctx.topology_ = std::move(topology);
  auto world = MpiCommunicator::duplicate(MPI_COMM_WORLD, "world", timeout);
  const MPI_Comm parent = world->mpi_comm();
  // Every rank creates its groups in this same order; each kind has its own tag. The MPI
  // groups all exist before the first NCCL bootstrap.
  int tag = 1;
  std::vector<std::pair<Axes, std::unique_ptr<Communicator> > > made;
  for (const GroupSpec& g : specs) {
    auto comm = MpiCommunicator::create(parent, g.members, g.name, timeout, tag++);
    if (options.nccl_rules) comm->follow_nccl_rules();
    made.emplace_back(g.axes, std::move(comm));
  }
  if (options.nccl_rules) world->follow_nccl_rules();
  ctx.world_ = on_device(std::move(world), device, timeout);
  for (auto& [axes, comm] : made) ctx.add(axes, on_device(std::move(comm), device, timeout));
  return ctx;
#endif
}

ParallelContext ParallelContext::single_process(Device device) {
  ParallelContext ctx(DeviceMesh(MeshShape{}, 1), 0, device);
  const double timeout = device.is_cpu() ? 0.0 : default_comm_timeout_s();
  auto make = [&](const std::string& name) {
    return on_device(std::make_unique<SelfCommunicator>(name), device, timeout);
  };
  ctx.world_ = make("world");
  for (const GroupSpec& g : group_specs(ctx.mesh_, 0, ParallelOptions{}))
    ctx.add(g.axes, make(g.name));
  return ctx;
}

void ParallelContext::set_observer(const CommObserver& observer) {
  world_->set_observer(observer);
  for (auto& [k, c] : groups_) c->set_observer(observer);
}

std::string ParallelContext::str() const {
  std::string coords;
  for (const MeshAxis& a : mesh_.axes())
    coords += " " + a.name + "=" + std::to_string(mesh_.coord(rank_, a.name));
  return detail::str("rank ", rank_, " of ", world_size(), ":", coords, " (mesh ", mesh_.str(),
                     ")");
}

}  // namespace loom::parallel
