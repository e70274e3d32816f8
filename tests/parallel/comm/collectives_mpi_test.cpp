// tests/parallel/comm/collectives_mpi_test.cpp — every MpiCommunicator collective against its
// definition, on every group of the test layouts (mpi_test_util.h), for odd sizes and sizes
// not divisible by the group size, f32/f64/i32/i64. References are computed locally from the
// members' regenerated inputs; reductions must equal the rank-order reduction bit for bit on
// every rank (Note [Deterministic reductions]).
// loom-mpi-test: ranks 3 8
// loom-multihost-test: 4x2
#include <gtest/gtest.h>

#include <functional>

#include "parallel/comm/communicator.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel {
namespace {

using testing::bits_hash;
using testing::member_input;
using testing::same_bits;
using testing::world_rank;

const DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kI32, DType::kI64};

std::vector<int64_t> sizes_for(int group_size) {
  return {0, 1, 3, 17, 65, 7 * static_cast<int64_t>(group_size) + 3};
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF64; }

const char* op_name(ReduceOp op) {
  return op == ReduceOp::kSum ? "sum" : op == ReduceOp::kAvg ? "avg" : "max";
}

// Runs fn on every group of every test layout. `case_id` advances identically on all ranks,
// so each (group, case) gets the same inputs everywhere.
void for_each_group(
    const std::function<void(Communicator&, const std::vector<int>&, uint64_t&)>& fn) {
  uint64_t case_id = 1;
  for (const ParallelOptions& opts : testing::test_layouts()) {
    ParallelContext ctx = ParallelContext::create(opts);
    for (const auto& g : testing::groups_of(ctx, opts.mics_partition_size)) {
      SCOPED_TRACE(::testing::Message() << "group " << g.comm->name() << " of " << ctx.str());
      ASSERT_EQ(g.comm->size(), static_cast<int>(g.members.size()));
      fn(*g.comm, g.members, case_id);
    }
  }
}

template <typename T>
void reference_reduce_typed(const std::vector<Tensor>& ins, ReduceOp op, Tensor& out) {
  T* o = out.data<T>();
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = ins[0].data<T>()[i];
  for (size_t j = 1; j < ins.size(); ++j) {
    const T* x = ins[j].data<T>();
    for (int64_t i = 0; i < n; ++i)
      o[i] = op == ReduceOp::kMax ? (x[i] > o[i] ? x[i] : o[i]) : o[i] + x[i];
  }
  if (op == ReduceOp::kAvg) {
    for (int64_t i = 0; i < n; ++i) o[i] = o[i] / static_cast<T>(ins.size());
  }
}

// The members' inputs reduced in member (= group rank) order, in their dtype.
Tensor reference_reduce(const std::vector<Tensor>& ins, ReduceOp op) {
  Tensor out = Tensor::empty(ins[0].shape(), ins[0].dtype());
  switch (ins[0].dtype()) {
    case DType::kF32:
      reference_reduce_typed<float>(ins, op, out);
      break;
    case DType::kF64:
      reference_reduce_typed<double>(ins, op, out);
      break;
    case DType::kI32:
      reference_reduce_typed<int32_t>(ins, op, out);
      break;
    case DType::kI64:
      reference_reduce_typed<int64_t>(ins, op, out);
      break;
    default:
      ADD_FAILURE() << "unexpected dtype";
  }
  return out;
}

std::vector<Tensor> member_inputs(const std::vector<int>& members, uint64_t id, const Shape& shape,
                                  DType dt) {
  std::vector<Tensor> ins;
  for (int m : members) ins.push_back(member_input(m, id, shape, dt));
  return ins;
}

// Every member of the group holds the same bits in t.
void expect_identical_across(Communicator& comm, const Tensor& t) {
  Tensor mine = Tensor::from_vector<int64_t>({bits_hash(t)}, {1});
  Tensor all = Tensor::empty({comm.size()}, DType::kI64);
  comm.all_gather(mine, all);
  for (int i = 0; i < comm.size(); ++i) {
    EXPECT_EQ(all.data<int64_t>()[i], mine.data<int64_t>()[0]) << "member " << i << " differs";
  }
}

// Chunk `i` (n elements) of a (k·n) tensor equals `want` (n elements).
bool chunk_equals(const Tensor& t, int64_t i, int64_t n, const Tensor& want,
                  int64_t want_chunk = 0) {
  const size_t es = dtype_size(t.dtype());
  if (n == 0) return true;
  return std::memcmp(
             static_cast<const char*>(t.raw_data()) + static_cast<size_t>(i * n) * es,
             static_cast<const char*>(want.raw_data()) + static_cast<size_t>(want_chunk * n) * es,
             static_cast<size_t>(n) * es) == 0;
}

TEST(Collectives, AllReduceIsRankOrderReductionWithIdenticalBits) {
  for_each_group([](Communicator& comm, const std::vector<int>& members, uint64_t& id) {
    for (int64_t n : sizes_for(comm.size())) {
      for (DType dt : kAllDTypes) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
          if (!is_float(dt) && op == ReduceOp::kAvg) continue;
          ++id;
          Tensor t = member_input(world_rank(), id, {n}, dt);
          comm.all_reduce(t, op);
          const Tensor ref = reference_reduce(member_inputs(members, id, {n}, dt), op);
          EXPECT_TRUE(same_bits(t, ref))
              << "all_reduce " << op_name(op) << " " << dtype_name(dt) << " n=" << n;
          expect_identical_across(comm, t);
        }
      }
    }
  });
}

TEST(Collectives, ReduceScatterIsThisRanksChunkOfTheReduction) {
  for_each_group([](Communicator& comm, const std::vector<int>& members, uint64_t& id) {
    const int64_t k = comm.size();
    for (int64_t n : sizes_for(comm.size())) {
      for (DType dt : kAllDTypes) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
          if (!is_float(dt) && op == ReduceOp::kAvg) continue;
          ++id;
          Tensor in = member_input(world_rank(), id, {k * n}, dt);
          Tensor out = Tensor::empty({n}, dt);
          comm.reduce_scatter(in, out, op);
          const Tensor ref = reference_reduce(member_inputs(members, id, {k * n}, dt), op);
          EXPECT_TRUE(chunk_equals(ref, comm.rank(), n, out))
              << "reduce_scatter " << op_name(op) << " " << dtype_name(dt) << " n=" << n;
        }
      }
    }
  });
}

TEST(Collectives, AllGatherConcatenatesInRankOrder) {
  for_each_group([](Communicator& comm, const std::vector<int>& members, uint64_t& id) {
    for (int64_t n : sizes_for(comm.size())) {
      for (DType dt : kAllDTypes) {
        ++id;
        Tensor in = member_input(world_rank(), id, {n}, dt);
        Tensor out = Tensor::empty({comm.size() * n}, dt);
        comm.all_gather(in, out);
        const auto ins = member_inputs(members, id, {n}, dt);
        for (int i = 0; i < comm.size(); ++i) {
          EXPECT_TRUE(chunk_equals(out, i, n, ins[static_cast<size_t>(i)]))
              << "all_gather " << dtype_name(dt) << " n=" << n << " chunk " << i;
        }
      }
    }
  });
}

TEST(Collectives, AllToAllTransposesChunks) {
  for_each_group([](Communicator& comm, const std::vector<int>& members, uint64_t& id) {
    const int64_t k = comm.size();
    for (int64_t n : sizes_for(comm.size())) {
      for (DType dt : kAllDTypes) {
        ++id;
        Tensor in = member_input(world_rank(), id, {k * n}, dt);
        Tensor out = Tensor::empty({k * n}, dt);
        comm.all_to_all(in, out);
        const auto ins = member_inputs(members, id, {k * n}, dt);
        for (int i = 0; i < comm.size(); ++i) {  // chunk i of out = chunk rank of member i's in
          EXPECT_TRUE(chunk_equals(out, i, n, ins[static_cast<size_t>(i)], comm.rank()))
              << "all_to_all " << dtype_name(dt) << " n=" << n << " chunk " << i;
        }
      }
    }
  });
}

TEST(Collectives, BroadcastFromEveryRoot) {
  for_each_group([](Communicator& comm, const std::vector<int>& members, uint64_t& id) {
    for (int64_t n : sizes_for(comm.size())) {
      for (DType dt : kAllDTypes) {
        for (int root = 0; root < comm.size(); ++root) {
          ++id;
          Tensor t = member_input(world_rank(), id, {n}, dt);
          comm.broadcast(t, root);
          EXPECT_TRUE(same_bits(t, member_input(members[static_cast<size_t>(root)], id, {n}, dt)))
              << "broadcast " << dtype_name(dt) << " n=" << n << " root " << root;
        }
      }
    }
  });
}

TEST(Collectives, BarrierAndTwoDimensionalTensors) {
  for_each_group([](Communicator& comm, const std::vector<int>& members, uint64_t& id) {
    comm.barrier();
    ++id;
    Tensor t = member_input(world_rank(), id, {3, 5}, DType::kF32);
    comm.all_reduce(t, ReduceOp::kSum);
    EXPECT_TRUE(same_bits(
        t, reference_reduce(member_inputs(members, id, {3, 5}, DType::kF32), ReduceOp::kSum)));
  });
}

// bf16 and f16 reductions (tensor-parallel activations' gradients in 16-bit precision): the
// members' values widened to f32, reduced there in rank order and rounded once, on every rank.
TEST(Collectives, SixteenBitReductionsRoundTheF32RankOrderResultOnce) {
  ParallelOptions opts = testing::test_layouts()[0];
  ParallelContext ctx = ParallelContext::create(opts);
  Communicator& w = ctx.world();
  const int k = w.size();
  const int64_t n = 7 * k + 3;
  auto value = [](int r, int64_t i) {
    return 1.0f + 0.37f * static_cast<float>(r) + 0.011f * static_cast<float>(i);
  };
  for (const DType dt : {DType::kBF16, DType::kF16}) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      std::vector<float> mine(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = value(w.rank(), i);
      Tensor t = Tensor::from_vector(mine, {n}).to(dt);
      w.all_reduce(t, op);
      std::vector<float> want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        float acc = 0;
        for (int r = 0; r < k; ++r) {  // each member's value as its 16-bit tensor holds it
          const float x =
              Tensor::from_vector(std::vector<float>{value(r, i)}, {1}).to(dt).to_vector()[0];
          acc = r == 0 ? x : op == ReduceOp::kMax ? std::max(acc, x) : acc + x;
        }
        if (op == ReduceOp::kAvg) acc /= static_cast<float>(k);
        want[static_cast<size_t>(i)] = acc;
      }
      const Tensor expected = Tensor::from_vector(want, {n}).to(dt);
      EXPECT_TRUE(same_bits(t, expected)) << dtype_name(dt) << " " << op_name(op);
    }
  }
}

TEST(Collectives, BadArgumentsThrowAtIssue) {
  ParallelOptions opts = testing::test_layouts()[0];
  ParallelContext ctx = ParallelContext::create(opts);
  Communicator& w = ctx.world();
  const int k = w.size();
  Tensor in = Tensor::zeros({k * 2 + 1});
  Tensor out = Tensor::zeros({2});
  EXPECT_THROW(w.reduce_scatter_async(in, out, ReduceOp::kSum), Error);
  EXPECT_THROW(w.all_reduce_async(Tensor::zeros({3}, DType::kI32), ReduceOp::kAvg), Error);
  EXPECT_THROW(w.all_reduce_async(Tensor::zeros({3}, DType::kU16), ReduceOp::kSum), Error);
  EXPECT_THROW(w.all_gather_async(Tensor::zeros({2}), Tensor::zeros({2 * k + 1})), Error);
  EXPECT_THROW(w.broadcast_async(Tensor::zeros({2}), k), Error);
  EXPECT_THROW(w.send_async(Tensor::zeros({2}), -1, 0), Error);
  Tensor strided = Tensor::zeros({4, 4}).transpose(0, 1);
  try {
    w.all_reduce_async(strided, ReduceOp::kSum);
    ADD_FAILURE() << "non-contiguous tensor accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce on group world: t must be contiguous"),
              std::string::npos)
        << e.what();
  }
  w.barrier();  // nothing above was issued: the group is still in step
}

}  // namespace
}  // namespace loom::parallel
