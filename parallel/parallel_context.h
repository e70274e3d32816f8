// parallel/parallel_context.h — ParallelContext: one rank's view of the parallel layout (the
// mesh, its coordinates) and the communicators of every group it belongs to, asked for by axis
// names: group({"dp", "cp"}). It is created once (after MPI is initialised, see
// parallel/launcher.h) and passed explicitly to whatever communicates; Loom keeps no global
// context. It holds no training state.
//
// Groups exist for: the world; every mesh axis alone; {dp, cp} (data parallelism's reduction
// group under context parallelism); the MiCS axes mics_partition and mics_replica, which split
// {dp, cp} (Note [MiCS groups] in parallel/mesh.h); and whatever ParallelOptions::groups adds.
// Every one always exists, size-1 ones included (a size-1 communicator completes its
// collectives at once), so callers never test for absence. Without MiCS (mics_partition_size 0)
// the partition is the whole {dp, cp} group and each replica group is the rank alone. The cp
// group's split for hybrid attention, cp_ulysses and cp_ring (parallel/mesh.h), exists likewise:
// without it (cp_ulysses 0) each Ulysses group is the rank alone and the ring the cp group. Asking
// for a group that was not created is an error naming it: groups are created collectively, so they
// cannot appear on first use.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "parallel/comm/communicator.h"
#include "parallel/mesh.h"
#include "parallel/topology.h"

namespace loom::parallel {

// The parallel.* settings the context is built from.
struct ParallelOptions {
  MeshShape shape;                        // parallel.dp, pp, cp, tp
  std::string order = kDefaultMeshOrder;  // parallel.order (Note [Mesh rank order])
  // Empty: the four axes of `shape` in `order`. Else the mesh's axes, innermost first (a fork's
  // own axes; `shape` and `order` are then unused) — they must include tp, cp, dp and pp.
  std::vector<MeshAxis> axes;
  std::vector<Axes> groups;     // groups beyond the standard ones (each a set of axis names)
  int mics_partition_size = 0;  // parallel.mics_partition_size; 0 means dp·cp (no MiCS)
  int cp_ulysses = 0;           // parallel.cp_ulysses (hybrid cp attention), dividing cp; 0 means 1
  double comm_timeout_s = 0;    // 0: LOOM_COMM_TIMEOUT_S, else 300 s
  // Where the rank computes. kCuda: GPU `local_rank` (the rank's index on its node), and every
  // group's communicator is an NcclCommunicator (CPU tensors still go over MPI through it);
  // needs a CUDA build and one GPU per rank on each node. kCpu: MpiCommunicators.
  DeviceType device = DeviceType::kCpu;
  // Every MPI communicator follows NCCL's point-to-point rules (Note [NCCL rules on MPI] in
  // parallel/comm/mpi_communicator.h): checks a layout's NCCL safety on CPUs.
  bool nccl_rules = false;
  // Tensor-parallel groups may span hosts (parallel.tp_across_hosts; Note [Tensor parallelism
  // inside a host] in parallel/topology.h).
  bool tp_across_hosts = false;
};

class ParallelContext {
 public:
  // Collective over MPI_COMM_WORLD (every rank calls it with the same options): checks the
  // layout against the world size (ConfigError naming the key), then creates the
  // communicators, each over its own MPI communicator with its own worker thread.
  static ParallelContext create(const ParallelOptions& options);
  // World size 1 without MPI (single-process tools and tests): every group is the rank
  // alone, served by a synchronous in-process communicator (send/recv are errors). With a CUDA
  // `device`, each group is an NcclCommunicator of one on that GPU (its NCCL communicator made
  // on first use) whose CPU tensors go to the in-process communicator.
  static ParallelContext single_process(Device device = Device::cpu());

  ParallelContext(ParallelContext&&) noexcept;
  ParallelContext& operator=(ParallelContext&&) noexcept;
  ~ParallelContext();

  const DeviceMesh& mesh() const { return mesh_; }
  int rank() const { return rank_; }  // in the world
  int world_size() const { return mesh_.world_size(); }
  // The device this rank computes on: cpu, or cuda:<local rank> (ParallelOptions::device).
  Device device() const { return device_; }
  Communicator& world() const { return *world_; }
  // The start-up line saying which host each rank is on (MPI's shared-memory split) and how the
  // groups map to hosts (parallel/topology.h).
  const std::string& topology() const { return topology_; }

  // The group varying along `axes` (any order; a mesh axis or a MiCS axis each); the rank
  // within a one-axis group is this rank's coordinate on that axis. Throws naming the axes
  // when no such group was created.
  Communicator& group(const Axes& axes) const;
  // This rank's coordinate along one axis, and its size (MiCS axes included).
  int axis_rank(const std::string& axis) const { return group({axis}).rank(); }
  int axis_size(const std::string& axis) const { return group({axis}).size(); }

  // Shorthands for the engine's four axes.
  Communicator& dp() const { return group({kAxisDp}); }
  Communicator& pp() const { return group({kAxisPp}); }
  Communicator& cp() const { return group({kAxisCp}); }
  Communicator& tp() const { return group({kAxisTp}); }
  int dp_rank() const { return axis_rank(kAxisDp); }
  int pp_rank() const { return axis_rank(kAxisPp); }
  int cp_rank() const { return axis_rank(kAxisCp); }
  int tp_rank() const { return axis_rank(kAxisTp); }
  int dp_size() const { return axis_size(kAxisDp); }
  int pp_size() const { return axis_size(kAxisPp); }
  int cp_size() const { return axis_size(kAxisCp); }
  int tp_size() const { return axis_size(kAxisTp); }

  // Installs the observer on every communicator of this context.
  void set_observer(const CommObserver& observer);
  std::string str() const;  // "rank 5 of 8: tp=1 cp=0 dp=0 pp=1 (mesh tp=2 …)"

 private:
  ParallelContext(DeviceMesh mesh, int rank, Device device);
  static std::string key(Axes axes);  // the axes sorted and joined
  void add(const Axes& axes, std::unique_ptr<Communicator> comm);

  DeviceMesh mesh_;
  int rank_;
  Device device_;
  std::unique_ptr<Communicator> world_;
  std::map<std::string, std::unique_ptr<Communicator>> groups_;  // by key()
  std::string topology_;
};

}  // namespace loom::parallel
