// tests/core/ops/embedding_test.cpp — embedding lookup: values for every index dtype, repeated
// ids accumulating, thread-count independence, and the out-of-range error. Gradients (finite
// differences in f64, f32 against f64, other backends) are the conformance table's embedding
// cases (tests/conformance/cases/embedding.cpp).
#include "core/ops/embedding.h"

#include <omp.h>

#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::random;

TEST(Embedding, ValuesForEveryIndexDtype) {
  Generator gen(52);
  Tensor w = random({7, 5}, gen, DType::kF64, false);
  const std::vector<int64_t> ids{3, 0, 6, 3};
  for (Tensor t : {Tensor::from_vector(ids, {2, 2}),
                   Tensor::from_vector(std::vector<int32_t>{3, 0, 6, 3}, {2, 2}),
                   Tensor::from_vector(std::vector<uint16_t>{3, 0, 6, 3}, {2, 2}),
                   Tensor::from_vector(std::vector<uint32_t>{3, 0, 6, 3}, {2, 2})}) {
    Tensor out = ops::embedding(t, w);
    ASSERT_EQ(out.shape(), (Shape{2, 2, 5}));
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(out.at({i / 2, i % 2, j}), w.at({ids[i], j}));
    }
  }
}

TEST(Embedding, RepeatedIdsAccumulate) {
  Generator gen(53);
  const std::vector<int64_t> ids{2, 0, 2, 2, 4, 0};
  Tensor w = random({6, 3}, gen);
  Tensor out = ops::embedding(Tensor::from_vector(ids, {6}), w);
  Tensor dout = random({6, 3}, gen, DType::kF64, false);
  autograd::backward({out}, {dout});
  for (int64_t v = 0; v < 6; ++v) {
    for (int64_t c = 0; c < 3; ++c) {
      double ref = 0;
      for (int64_t n = 0; n < 6; ++n) ref += ids[n] == v ? dout.at({n, c}) : 0.0;
      EXPECT_NEAR(w.grad().at({v, c}), ref, 1e-15) << "row " << v;
    }
  }
}

TEST(Embedding, ResultsDoNotDependOnThreadCount) {
  Generator gen(54);
  Tensor ids = randint({20000}, 0, 3000, gen, DType::kI32);
  Tensor w = random({3000, 65}, gen, DType::kF32);
  Tensor dout = random({20000, 65}, gen, DType::kF32, false);
  auto run = [&](int threads) {
    const int prev = omp_get_max_threads();
    omp_set_num_threads(threads);
    w.zero_grad();
    Tensor out = ops::embedding(ids, w);
    autograd::backward({out}, {dout});
    omp_set_num_threads(prev);
    return std::make_pair(out.to_vector(), w.grad().to_vector());
  };
  EXPECT_EQ(run(1), run(2));
}

TEST(Embedding, OutOfRangeIdIsNamed) {
  Tensor w = Tensor::zeros({17, 4});
  for (int64_t bad : {int64_t{17}, int64_t{-1}}) {
    try {
      ops::embedding(Tensor::from_vector(std::vector<int64_t>{0, 5, bad}, {3}), w);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("embedding: id " + std::to_string(bad) + " at position 2"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("V=17"), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(ops::embedding(Tensor::zeros({3}), w), Error);  // floating ids
}

}  // namespace
}  // namespace loom
