// parallel/parallel_context.h — ParallelContext: one rank's view of the parallel layout (the
// mesh, its coordinates) and the communicators of every group it belongs to. It is created
// once (after MPI is initialised, see parallel/launcher.h) and passed explicitly to whatever
// communicates; Loom keeps no global context. It holds no training state.
//
// Every communicator always exists, including those of size-1 dimensions (a size-1
// communicator completes its collectives at once), so callers never test for absence: world,
// tp, cp, dp, pp, mics_partition, mics_replica and dp_cp. Without MiCS (mics_partition_size 0)
// the partition group is the whole dp·cp group (the dp group when cp = 1) and each replica
// group is the rank alone.
#pragma once

#include <memory>
#include <string>

#include "parallel/comm/communicator.h"
#include "parallel/mesh.h"

namespace loom::parallel {

// The parallel.* settings the context is built from.
struct ParallelOptions {
  MeshShape shape;                        // parallel.dp, pp, cp, tp
  std::string order = kDefaultMeshOrder;  // parallel.order (Note [Mesh rank order])
  int mics_partition_size = 0;            // parallel.mics_partition_size; 0 means dp·cp (no MiCS)
  double comm_timeout_s = 0;              // 0: LOOM_COMM_TIMEOUT_S, else 300 s
  // Where the rank computes. kCuda: GPU `local_rank` (the rank's index on its node), and every
  // group's communicator is an NcclCommunicator (CPU tensors still go over MPI through it);
  // needs a CUDA build and one GPU per rank on each node. kCpu: MpiCommunicators.
  DeviceType device = DeviceType::kCpu;
  // Every MPI communicator follows NCCL's point-to-point rules (Note [NCCL rules on MPI] in
  // parallel/comm/mpi_communicator.h): checks a layout's NCCL safety on CPUs.
  bool nccl_rules = false;
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
  const MeshCoords& coords() const { return coords_; }  // this rank's
  int rank() const { return rank_; }                    // in the world
  int world_size() const { return mesh_.world_size(); }
  // The device this rank computes on: cpu, or cuda:<local rank> (ParallelOptions::device).
  Device device() const { return device_; }
  Communicator& world() const { return *world_; }

  // The group along a mesh dimension; rank within it = this rank's coordinate there.
  Communicator& group(MeshDim d) const;
  Communicator& dp() const { return group(MeshDim::kDp); }
  Communicator& pp() const { return group(MeshDim::kPp); }
  Communicator& cp() const { return group(MeshDim::kCp); }
  Communicator& tp() const { return group(MeshDim::kTp); }
  int dp_rank() const { return coords_.dp; }
  int pp_rank() const { return coords_.pp; }
  int cp_rank() const { return coords_.cp; }
  int tp_rank() const { return coords_.tp; }
  int dp_size() const { return mesh_.shape().dp; }
  int pp_size() const { return mesh_.shape().pp; }
  int cp_size() const { return mesh_.shape().cp; }
  int tp_size() const { return mesh_.shape().tp; }

  // MiCS (Note [MiCS groups] in parallel/mesh.h): shard inside the partition, replicate
  // across the replica group; both inside dp_cp (dp when cp = 1).
  Communicator& mics_partition() const { return *mics_partition_; }
  Communicator& mics_replica() const { return *mics_replica_; }
  // dp and cp together (DeviceMesh::dp_cp_group): the data-parallel reduction group under
  // context parallelism.
  Communicator& dp_cp() const { return *dp_cp_; }
  int mics_partition_rank() const { return mics_partition_->rank(); }
  int mics_partition_size() const { return mics_partition_->size(); }
  int mics_replica_rank() const { return mics_replica_->rank(); }
  int mics_replica_size() const { return mics_replica_->size(); }

  // Installs the observer on every communicator of this context.
  void set_observer(const CommObserver& observer);
  std::string str() const;  // "rank 5 of 8: dp=1 pp=0 cp=0 tp=1 (mesh dp=2 …)"

 private:
  ParallelContext(DeviceMesh mesh, int rank, Device device);

  DeviceMesh mesh_;
  int rank_;
  MeshCoords coords_;
  Device device_;
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<Communicator> dims_[kNumMeshDims];  // indexed by MeshDim
  std::unique_ptr<Communicator> mics_partition_;
  std::unique_ptr<Communicator> mics_replica_;
  std::unique_ptr<Communicator> dp_cp_;
};

}  // namespace loom::parallel
