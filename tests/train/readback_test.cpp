// tests/train/readback_test.cpp — Readback on the CPU: values read at start() and kept by the
// pending read (moves included); bad tensors rejected. The device path (pinned slots, the copy
// behind the compute stream's work) is checked in tests/cuda/runtime_test.cpp.
#include "train/readback.h"

#include <gtest/gtest.h>

#include "core/ops/view.h"
#include "core/rng.h"

namespace loom {
namespace {

TEST(Readback, CpuValuesAreReadAtStart) {
  Readback rb;
  Generator gen(3);
  Tensor t = randn({5}, gen, DType::kF64);
  const std::vector<double> want = t.to_vector();
  Readback::Pending p = rb.start(t);
  ops::copy_(t, Tensor::zeros({5}, DType::kF64));  // read already: later writes do not reach it
  Readback::Pending moved = std::move(p);
  EXPECT_EQ(moved.get(), want);
  EXPECT_EQ(moved.get(), want);  // again: the same values
}

TEST(Readback, RejectsWhatASlotCannotHold) {
  Readback rb;
  EXPECT_THROW(rb.start(Tensor::zeros({2}, DType::kF32)), Error);
  EXPECT_THROW(rb.start(Tensor::zeros({Readback::kSlotValues + 1}, DType::kF64)), Error);
  EXPECT_THROW(rb.start(Tensor::zeros({4, 2}, DType::kF64).transpose(0, 1)), Error);
}

}  // namespace
}  // namespace loom
