// tests/parallel/mpi_test_util.h — helpers for the tests that run under mpirun: the layouts
// the tests build for a given world size, every group of a context with its expected member
// list, per-rank random inputs that any rank can regenerate (so references are computed
// locally, never through the communicator under test), and bitwise comparison.
#pragma once

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "parallel/parallel_context.h"

namespace loom::parallel::testing {

// Short enough that a mismatched collective fails a test instead of hanging the job.
constexpr double kTestCommTimeoutS = 30.0;

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The layouts tested at this world size: with 8 ranks a 2×2×2 (tp, cp, dp) mesh in the
// default order with MiCS partitions of 2 of the dp·cp group, and a dp 4 × pp 2 mesh with MiCS
// partitions of 2 in another order; otherwise
// dp = world (MiCS partitions of 1).
inline std::vector<ParallelOptions> test_layouts() {
  const int n = world_size();
  std::vector<ParallelOptions> out;
  if (n == 8) {
    ParallelOptions a;
    a.shape = {.dp = 2, .pp = 1, .cp = 2, .tp = 2};
    a.mics_partition_size = 2;
    out.push_back(a);
    ParallelOptions b;
    b.shape = {.dp = 4, .pp = 2, .cp = 1, .tp = 1};
    b.order = "pp-dp-cp-tp";
    b.mics_partition_size = 2;
    out.push_back(b);
  } else {
    ParallelOptions a;
    a.shape = {.dp = n, .pp = 1, .cp = 1, .tp = 1};
    a.mics_partition_size = 1;
    out.push_back(a);
  }
  for (auto& o : out) o.comm_timeout_s = kTestCommTimeoutS;
  return out;
}

struct GroupUnderTest {
  Communicator* comm;
  std::vector<int> members;  // world ranks, group rank order
};

// Every communicator of ctx with the member list the mesh says it must have.
inline std::vector<GroupUnderTest> groups_of(const ParallelContext& ctx, int mics_partition_size) {
  const DeviceMesh& mesh = ctx.mesh();
  const int r = ctx.rank();
  std::vector<int> all;
  for (int i = 0; i < ctx.world_size(); ++i) all.push_back(i);
  const Axes dp_cp = {kAxisDp, kAxisCp};
  const int p =
      mics_partition_size == 0 ? mesh.size(kAxisDp) * mesh.size(kAxisCp) : mics_partition_size;
  return {
      {&ctx.world(), all},
      {&ctx.tp(), mesh.group_members(r, {kAxisTp})},
      {&ctx.cp(), mesh.group_members(r, {kAxisCp})},
      {&ctx.dp(), mesh.group_members(r, {kAxisDp})},
      {&ctx.pp(), mesh.group_members(r, {kAxisPp})},
      {&ctx.group(dp_cp), mesh.group_members(r, dp_cp)},
      {&ctx.group({kAxisCp, kAxisDp}), mesh.group_members(r, dp_cp)},  // any order
      {&ctx.group({kAxisMicsPartition}), mesh.partition_group(r, dp_cp, p)},
      {&ctx.group({kAxisMicsReplica}), mesh.replica_group(r, dp_cp, p)},
  };
}

// The input of `rank` (a world rank) for test case `salt`: random, any dtype.
inline Tensor member_input(int rank, uint64_t salt, const Shape& shape, DType dtype) {
  Generator gen(salt * 1000003ULL + static_cast<uint64_t>(rank));
  if (dtype == DType::kF32 || dtype == DType::kF64) return randn(shape, gen, dtype);
  return randint(shape, -1000, 1000, gen, dtype);
}

// ‖got − want‖ / ‖want‖ over all elements in double (‖got − want‖ when want is 0); +inf when
// got holds a NaN or an infinity, so NaN never passes a tolerance.
inline double rel_err(const Tensor& want, const Tensor& got) {
  const std::vector<double> a = want.contiguous().to_vector(), b = got.contiguous().to_vector();
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(b[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += a[i] * a[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         (a.numel() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

// A 64-bit FNV-1a hash of a tensor's bytes (to compare results across ranks cheaply).
inline int64_t bits_hash(const Tensor& t) {
  uint64_t h = 1469598103934665603ULL;
  const auto* p = static_cast<const unsigned char*>(t.numel() ? t.raw_data() : nullptr);
  for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return static_cast<int64_t>(h);
}

}  // namespace loom::parallel::testing
