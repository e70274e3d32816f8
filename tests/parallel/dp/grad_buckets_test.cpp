// tests/parallel/dp/grad_buckets_test.cpp — GradBuckets (parallel/dp/grad_buckets.h) in one
// process, with no communicator: parameters re-homed into their bucket's flat buffer with their
// values kept, gradients accumulating in the buckets, the completion callback once per bucket
// per backward (again after a recount), a gradient arriving at a sealed bucket refused, the
// owned ranges of two shard ranks tiling every parameter exactly once, and the gradient-buffer
// bytes counted until a reduction hands its buffer back.
#include "parallel/dp/grad_buckets.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/rng.h"

namespace loom::parallel::dp {
namespace {

struct Params {
  Tensor a, b, c;
  NamedTensors named() const { return {{"a", a}, {"b", b}, {"c", c}}; }
};

Params make_params(Generator& gen) {
  Params p{randn({8, 5}, gen), randn({20}, gen), randn({4, 4}, gen)};
  for (Tensor* t : {&p.a, &p.b, &p.c}) t->set_requires_grad(true);
  return p;
}

// loss = Σ a·x + Σ b·y + Σ c·z: each gradient is its coefficient tensor.
Tensor loss_of(const Params& p, const Params& coef) {
  return ops::add(ops::add(ops::sum(ops::mul(p.a, coef.a)), ops::sum(ops::mul(p.b, coef.b))),
                  ops::sum(ops::mul(p.c, coef.c)));
}

GradBucketsOptions options(int rank) {
  GradBucketsOptions o;
  // Reverse order: c (64 B) and b (80 B) share bucket 0 (36 elements, padded to 2·32), a
  // (160 B) is alone in bucket 1 (40, padded to 64): both shard ranks own parameter elements.
  o.bucket_bytes = 150;
  o.shard_count = 2;
  o.shard_rank = rank;
  o.shard_grads = true;
  return o;
}

TEST(GradBuckets, RehomesParametersAndCollectsGradientsPerBucket) {
  Generator gen(11);
  Params p = make_params(gen);
  const std::vector<double> a0 = p.a.to_vector(), b0 = p.b.to_vector(), c0 = p.c.to_vector();
  Params coef = make_params(gen);
  DpStepLog log;
  GradBuckets buckets({p.named()}, options(0), log);
  ASSERT_EQ(buckets.size(), 2);
  EXPECT_EQ(buckets.param_names(0), (std::vector<std::string>{"c", "b"}));
  EXPECT_EQ(buckets.param_names(1), (std::vector<std::string>{"a"}));
  EXPECT_EQ(buckets.num_parameters(), 40 + 20 + 16);
  // Re-homed: the parameters read their bucket's flat buffer, with their values.
  EXPECT_EQ(p.a.storage(), buckets.bucket(1).param_flat.storage());
  EXPECT_EQ(p.b.storage(), buckets.bucket(0).param_flat.storage());
  EXPECT_EQ(p.a.to_vector(), a0);
  EXPECT_EQ(p.b.to_vector(), b0);
  EXPECT_EQ(p.c.to_vector(), c0);

  std::vector<int> completed;
  buckets.install_hooks([&](int b) { completed.push_back(b); });
  buckets.zero();
  autograd::backward(loss_of(p, coef));
  ASSERT_EQ(completed.size(), 2u);
  EXPECT_NE(completed[0], completed[1]);
  EXPECT_EQ(p.a.grad().storage(), buckets.bucket(1).grad_flat.storage());
  EXPECT_EQ(p.a.grad().to_vector(), coef.a.to_vector());
  EXPECT_EQ(p.b.grad().to_vector(), coef.b.to_vector());
  EXPECT_EQ(p.c.grad().to_vector(), coef.c.to_vector());

  // A second micro-batch after a recount accumulates into the same buffers and completes again.
  for (int b = 0; b < buckets.size(); ++b) buckets.recount(b);
  autograd::backward(loss_of(p, coef));
  EXPECT_EQ(completed.size(), 4u);
  const std::vector<double> twice = ops::scale(coef.b, 2.0).to_vector();
  EXPECT_EQ(p.b.grad().to_vector(), twice);

  // zero() clears the buffers; a sealed bucket (its reduction in flight) refuses a gradient.
  buckets.zero();
  EXPECT_EQ(p.a.grad().to_vector(), std::vector<double>(40, 0.0));
  buckets.bucket(0).sealed = true;
  try {
    autograd::backward(loss_of(p, coef));
    FAIL() << "a gradient for a sealed bucket must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("arrived after bucket 0"), std::string::npos) << e.what();
  }
}

TEST(GradBuckets, OwnedRangesOfTheShardRanksTileEveryParameterOnce) {
  std::map<std::string, std::vector<int>> covered;  // parameter → how often each element is owned
  for (int rank = 0; rank < 2; ++rank) {
    Generator gen(5);
    Params p = make_params(gen);
    DpStepLog log;
    GradBuckets buckets({p.named()}, options(rank), log);
    int64_t owned = 0;
    buckets.for_each_owned_piece([&](int bucket, const BucketParam& param, int64_t lo, int64_t hi) {
      const int64_t begin = buckets.owned_begin(bucket);
      EXPECT_GE(lo, begin);
      EXPECT_LE(hi, begin + buckets.bucket(bucket).plan.shard_numel);
      std::vector<int>& c = covered[param.name];
      c.resize(static_cast<size_t>(param.tensor.numel()));
      for (int64_t i = lo; i < hi; ++i) ++c[static_cast<size_t>(i - param.offset)];
      owned += hi - lo;
    });
    EXPECT_GT(owned, 0) << "rank " << rank;
  }
  ASSERT_EQ(covered.size(), 3u);
  for (const auto& [name, c] : covered) EXPECT_EQ(c, std::vector<int>(c.size(), 1)) << name;
}

TEST(GradBuckets, GradientBufferBytesStayCountedUntilHandedBack) {
  Generator gen(7);
  Params p = make_params(gen);
  DpStepLog log;
  GradBuckets buckets({p.named()}, options(0), log);
  EXPECT_EQ(buckets.peak_grad_buffer_bytes(), 0);  // nothing allocated before zero()
  buckets.zero();
  const int64_t both = static_cast<int64_t>(buckets.bucket(0).grad_flat.nbytes() +
                                            buckets.bucket(1).grad_flat.nbytes());
  EXPECT_EQ(buckets.peak_grad_buffer_bytes(), both);
  const Tensor taken = buckets.take_grad_buffer(1);  // a reduction still reads it
  EXPECT_FALSE(buckets.bucket(1).grad_flat.defined());
  EXPECT_FALSE(p.a.grad().defined());
  buckets.ensure_grad_buffer(1);  // a new one while the old is in flight: both counted
  EXPECT_EQ(buckets.peak_grad_buffer_bytes(), both + static_cast<int64_t>(taken.nbytes()));
  EXPECT_EQ(buckets.grad_buffer_bytes(), both + static_cast<int64_t>(taken.nbytes()));
  buckets.grad_buffer_done(taken.nbytes());
  EXPECT_EQ(buckets.grad_buffer_bytes(), both);
  buckets.drop_grad_buffer(0);
  buckets.drop_grad_buffer(1);
  EXPECT_EQ(buckets.grad_buffer_bytes(), 0);
  EXPECT_EQ(buckets.peak_grad_buffer_bytes(), both + static_cast<int64_t>(taken.nbytes()));
}

}  // namespace
}  // namespace loom::parallel::dp
