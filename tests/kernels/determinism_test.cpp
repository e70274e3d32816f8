// tests/kernels/determinism_test.cpp — element-wise and reduction kernels give the same bits
// with 1, 2 and 3 OpenMP threads (chunk edges never depend on the thread count).
#include <gtest/gtest.h>
#include <omp.h>

#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/rng.h"

namespace loom {
namespace {

template <typename F>
void expect_same_bits_for_thread_counts(F compute) {
  const int saved = omp_get_max_threads();
  std::vector<double> ref;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    const std::vector<double> got = compute().to_vector();
    if (ref.empty()) {
      ref = got;
    } else {
      EXPECT_EQ(got, ref) << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
}

TEST(Determinism, ElementwiseAndReductions) {
  Generator gen(31);
  // Sizes chosen so every kernel splits into several chunks.
  Tensor a = randn({257, 1031}, gen), b = randn({257, 1031}, gen), bias = randn({1031}, gen);
  expect_same_bits_for_thread_counts([&] { return ops::add(ops::mul(a, b), bias); });
  expect_same_bits_for_thread_counts(
      [&] { return ops::div(a, ops::add(b, Tensor::full({1}, 3.0))); });
  expect_same_bits_for_thread_counts([&] { return ops::sum(a, 0); });  // column sums
  expect_same_bits_for_thread_counts([&] { return ops::sum(a, 1); });  // row sums
  expect_same_bits_for_thread_counts([&] { return ops::sum(a); });
  expect_same_bits_for_thread_counts([&] { return ops::sum_squares(a); });
  expect_same_bits_for_thread_counts([&] {
    Tensor acc = a.clone();
    ops::add_(acc, b, 0.5);
    return acc;
  });
}

}  // namespace
}  // namespace loom
