// tests/kernels/vec_math_test.cpp — the vectorisable exp/sigmoid of kernels/cpu/vec_math.h
// against std::exp: relative error over the whole finite range, and the special values.
#include "kernels/cpu/vec_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace loom {
namespace {

using kernels::cpu::vexp;
using kernels::cpu::vsigmoid;

TEST(VecMath, ExpF64WithinAFewUlp) {
  double worst = 0;
  for (double x = -708.0; x <= 709.7; x += 0.0137) {
    const double ref = std::exp(x);
    worst = std::max(worst, std::abs(vexp(x) - ref) / ref);
  }
  EXPECT_LT(worst, 4 * std::numeric_limits<double>::epsilon());
}

TEST(VecMath, ExpF32WithinAFewUlp) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.7f; x += 0.00731f) {
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(static_cast<double>(vexp(x)) - ref) / ref);
  }
  EXPECT_LT(worst, 3 * std::numeric_limits<float>::epsilon());
}

template <typename T>
void expect_special_values() {
  const T inf = std::numeric_limits<T>::infinity();
  EXPECT_EQ(vexp(T(0)), T(1));
  EXPECT_EQ(vexp(inf), inf);
  EXPECT_EQ(vexp(T(1000)), inf);
  EXPECT_EQ(vexp(-inf), T(0));
  EXPECT_EQ(vexp(T(-1000)), T(0));
  EXPECT_TRUE(std::isnan(vexp(std::numeric_limits<T>::quiet_NaN())));
  EXPECT_EQ(vsigmoid(T(-1000)), T(0));
  EXPECT_EQ(vsigmoid(T(1000)), T(1));
  EXPECT_EQ(vsigmoid(T(0)), T(0.5));
  EXPECT_TRUE(std::isnan(vsigmoid(std::numeric_limits<T>::quiet_NaN())));
}

TEST(VecMath, SpecialValues) {
  expect_special_values<float>();
  expect_special_values<double>();
}

}  // namespace
}  // namespace loom
