// tests/optim/lr_schedule_test.cpp — every schedule kind at its key steps (first step, end of
// warmup, middle, end, past the end) and the validation messages.
#include "optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace loom {
namespace {

optim::LrSchedule make(const std::string& kind) {
  optim::LrSchedule s;
  s.kind = kind;
  s.max_lr = 1e-3;
  s.min_lr = 1e-4;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.decay_fraction = 0.2;
  return s;
}

void expect_warmup(const optim::LrSchedule& s) {
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-4);  // max_lr / warmup_steps
  EXPECT_DOUBLE_EQ(s.lr_at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1e-3);   // last warmup step reaches max_lr
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);  // first post-warmup step: progress 0
}

TEST(LrSchedule, Cosine) {
  const auto s = make("cosine");
  expect_warmup(s);
  EXPECT_DOUBLE_EQ(s.lr_at(60), 5.5e-4);  // halfway: (max + min) / 2
  EXPECT_NEAR(s.lr_at(35), 1e-4 + 9e-4 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(500), 1e-4);
}

TEST(LrSchedule, Linear) {
  const auto s = make("linear");
  expect_warmup(s);
  EXPECT_DOUBLE_EQ(s.lr_at(60), 5.5e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(35), 1e-3 - 9e-4 * 0.25);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(500), 1e-4);
}

TEST(LrSchedule, Constant) {
  const auto s = make("constant");
  expect_warmup(s);
  EXPECT_DOUBLE_EQ(s.lr_at(60), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(500), 1e-3);
}

TEST(LrSchedule, WarmupStableDecay) {
  const auto s = make("wsd");  // 22 decay steps, starting at step 88
  expect_warmup(s);
  EXPECT_DOUBLE_EQ(s.lr_at(60), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(87), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(88), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(99), 5.5e-4);  // halfway through the decay
  EXPECT_DOUBLE_EQ(s.lr_at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(500), 1e-4);
}

TEST(LrSchedule, NoWarmup) {
  auto s = make("cosine");
  s.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(55), 5.5e-4);
}

std::string error_of(const optim::LrSchedule& s) {
  try {
    s.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LrSchedule, ValidationNamesTheProblem) {
  auto s = make("cosin");
  const std::string want =
      "optim.lr_schedule: unknown kind 'cosin' (cosine, linear, constant, wsd)";
  EXPECT_NE(error_of(s).find(want), std::string::npos) << error_of(s);
  s = make("cosine");
  s.min_lr = 2e-3;
  EXPECT_NE(error_of(s).find("min_lr"), std::string::npos);
  s = make("linear");
  s.warmup_steps = 200;
  EXPECT_NE(error_of(s).find("warmup_steps (200) exceeds total_steps (110)"), std::string::npos);
  s = make("wsd");
  s.decay_fraction = 0.95;
  EXPECT_NE(error_of(s).find("overlaps warmup_steps"), std::string::npos) << error_of(s);
  s = make("wsd");
  s.decay_fraction = 1.5;
  EXPECT_NE(error_of(s).find("decay_fraction"), std::string::npos);
  s = make("cosine");
  s.total_steps = 0;
  EXPECT_NE(error_of(s).find("total_steps must be > 0"), std::string::npos);
  EXPECT_THROW(make("cosine").lr_at(-1), Error);
  EXPECT_EQ(error_of(make("constant")), "");
}

}  // namespace
}  // namespace loom
