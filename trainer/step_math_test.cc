#include "trainer/step_math.h"

#include <cmath>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

StepConfig ScalerConfig(int growth_interval) {
  StepConfig config;
  config.scaler_enabled = true;
  config.growth_interval = growth_interval;
  return config;
}

TEST(FinalizeStep, ScaleGrowsExactlyAtGrowthInterval) {
  StepConfig config = ScalerConfig(3);
  StepState state;
  state.scale = 1024;
  for (int step = 1; step <= 2; ++step) {
    FinalizeStep(config, 0, &state);
    EXPECT_EQ(state.scale, 1024) << "step " << step;
    EXPECT_EQ(state.growth_tracker, step);
  }
  FinalizeStep(config, 0, &state);
  EXPECT_EQ(state.scale, 2048);
  EXPECT_EQ(state.growth_tracker, 0);
  EXPECT_EQ(state.skipped_total, 0);
}

TEST(FinalizeStep, Overflow_SkipsBacksOffAndResetsTracker) {
  StepConfig config = ScalerConfig(3);
  StepState state;
  state.scale = 1024;
  FinalizeStep(config, 0, &state);
  ASSERT_EQ(state.growth_tracker, 1);
  state.found_inf = 1;
  state.sum_squares = INFINITY;
  FinalizeStep(config, 0, &state);
  EXPECT_EQ(state.skipped, 1);
  EXPECT_EQ(state.skipped_total, 1);
  EXPECT_EQ(state.last_scale, 1024) << "telemetry shows the scale the step used";
  EXPECT_EQ(state.scale, 512);
  EXPECT_EQ(state.growth_tracker, 0);
  EXPECT_TRUE(std::isinf(state.last_grad_norm));
}

TEST(FinalizeStep, GrowthToInfinity_IsRefused) {
  StepConfig config = ScalerConfig(1);
  StepState state;
  state.scale = 3e38f;
  FinalizeStep(config, 0, &state);
  EXPECT_EQ(state.scale, 3e38f);
  EXPECT_EQ(state.growth_tracker, 0);
}

TEST(FinalizeStep, WithoutScaler_NeverSkipsOrRescales) {
  StepConfig config;
  config.scaler_enabled = false;
  StepState state;
  state.scale = 1;
  state.found_inf = 1;
  FinalizeStep(config, 0, &state);
  EXPECT_EQ(state.skipped, 0);
  EXPECT_EQ(state.scale, 1);
}

TEST(FinalizeStep, ClipCoefficient_FollowsClipGradNorm) {
  StepConfig config = ScalerConfig(2000);
  config.max_grad_norm = 1.0f;
  StepState state;
  state.sum_squares = 16.0;  // norm 4
  FinalizeStep(config, 0, &state);
  EXPECT_FLOAT_EQ(state.clip_coef, 1.0f / (4.0f + 1e-6f));
  EXPECT_FLOAT_EQ(state.last_grad_norm, 4.0f) << "the norm is reported before clipping";
  state.sum_squares = 0.25;  // norm 0.5: below the limit, coefficient clamped to 1
  FinalizeStep(config, 0, &state);
  EXPECT_EQ(state.clip_coef, 1.0f);
}

TEST(InverseScale, IsComputedInDouble) {
  EXPECT_EQ(InverseScale(65536.0f), 1.0f / 65536.0f);
  EXPECT_EQ(InverseScale(3.0f), static_cast<float>(1.0 / 3.0));
}

}  // namespace
}  // namespace mptrain
