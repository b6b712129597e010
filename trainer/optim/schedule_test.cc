#include "trainer/optim/schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(LrSchedule, Constant) {
  LrSchedule schedule({}, 0.1, 10);
  for (int step = 1; step <= 10; ++step) EXPECT_EQ(schedule.At(step), 0.1);
}

TEST(LrSchedule, WarmupCosine_RisesLinearlyThenFallsToMinLr) {
  ScheduleConfig config;
  config.type = ScheduleType::kWarmupCosine;
  config.warmup_steps = 4;
  config.min_lr = 0.01;
  LrSchedule schedule(config, 0.1, 104);
  EXPECT_EQ(schedule.At(1), 0.0) << "t = 0";
  EXPECT_DOUBLE_EQ(schedule.At(2), 0.025);
  EXPECT_DOUBLE_EQ(schedule.At(4), 0.075);
  EXPECT_DOUBLE_EQ(schedule.At(5), 0.1) << "warm-up done: the peak";
  // Half way through the decay: cos(π/2) = 0, the mean of lr and min_lr.
  EXPECT_NEAR(schedule.At(55), 0.055, 1e-15);
  EXPECT_GT(schedule.At(104), 0.01);
  EXPECT_LT(schedule.At(104), 0.01 + 1e-4);  // p = 99/100 at the last step
  for (int step = 6; step <= 104; ++step) EXPECT_LT(schedule.At(step), schedule.At(step - 1));
}

TEST(LrSchedule, WarmupLinear_DecaysLinearly) {
  ScheduleConfig config;
  config.type = ScheduleType::kWarmupLinear;
  config.warmup_steps = 0;
  LrSchedule schedule(config, 1.0, 10);
  EXPECT_EQ(schedule.At(1), 1.0);
  EXPECT_DOUBLE_EQ(schedule.At(6), 0.5);
  EXPECT_DOUBLE_EQ(schedule.At(10), 0.1);
}

TEST(LrSchedule, Step_MultipliesByGammaEveryStepSize_InAnyOrder) {
  ScheduleConfig config;
  config.type = ScheduleType::kStep;
  config.step_size = 3;
  config.gamma = 0.1;
  LrSchedule schedule(config, 1.0, 100);
  EXPECT_EQ(schedule.At(1), 1.0);
  EXPECT_EQ(schedule.At(3), 1.0);
  EXPECT_EQ(schedule.At(4), 1.0 * 0.1);
  EXPECT_EQ(schedule.At(10), 1.0 * 0.1 * 0.1 * 0.1);
  EXPECT_EQ(schedule.At(7), 1.0 * 0.1 * 0.1) << "going back recomputes";
  EXPECT_EQ(schedule.At(10), 1.0 * 0.1 * 0.1 * 0.1);
}

}  // namespace
}  // namespace mptrain
