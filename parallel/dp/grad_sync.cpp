// parallel/dp/grad_sync.cpp — the all-reduce and reduce-scatter (one or two hop) strategies
// (see parallel/dp/grad_sync.h).
#include "parallel/dp/grad_sync.h"

namespace loom::parallel::dp {
namespace {

class AllReduceSync final : public GradSync {
 public:
  explicit AllReduceSync(Communicator& group) : group_(group) {}
  bool shards() const override { return false; }
  WorkPtr first_hop(const Tensor& grad, const Tensor&) override {
    return group_.all_reduce_async(grad, ReduceOp::kAvg);
  }
  std::string first_op() const override { return "all_reduce " + group_.name(); }

 private:
  Communicator& group_;
};

class ReduceScatterSync final : public GradSync {
 public:
  ReduceScatterSync(Communicator& shard, Communicator* replica)
      : shard_(shard), replica_(replica) {}
  bool shards() const override { return true; }
  WorkPtr first_hop(const Tensor& grad, const Tensor& out) override {
    return shard_.reduce_scatter_async(grad, out, ReduceOp::kAvg);
  }
  WorkPtr second_hop(const Tensor& shard) override {
    return replica_ ? replica_->all_reduce_async(shard, ReduceOp::kAvg) : nullptr;
  }
  bool has_second_hop() const override { return replica_ != nullptr; }
  std::string first_op() const override { return "reduce_scatter " + shard_.name(); }
  std::string second_op() const override {
    return replica_ ? "all_reduce " + replica_->name() : "";
  }

 private:
  Communicator& shard_;
  Communicator* replica_;
};

}  // namespace

std::unique_ptr<GradSync> make_grad_sync(int zero_stage, Communicator& group, Communicator& shard,
                                         Communicator* replica) {
  if (zero_stage < 2) return std::make_unique<AllReduceSync>(group);
  return std::make_unique<ReduceScatterSync>(shard, replica);
}

}  // namespace loom::parallel::dp
