#include "trainer/optim/update_math.h"

#include <cmath>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

StepState AfterSteps(int64_t done, int64_t skipped) {
  StepState state;
  state.steps_done = done;
  state.skipped_total = skipped;
  return state;
}

TEST(SgdUpdate, MatchesTorchSgdWithMomentumAndWeightDecay) {
  UpdateRule rule;
  rule.lr = 0.1;
  rule.momentum = 0.9f;
  rule.weight_decay = 0.01f;
  const UpdateCoefficients c = PrepareUpdate(rule, AfterSteps(1, 0));
  float param = 1.0f, buffer = 0.0f;
  SgdUpdate(rule, c, 0.5f, &param, &buffer);
  // First step: buf = g + wd * p = 0.51; p = 1 - 0.1 * 0.51
  EXPECT_FLOAT_EQ(buffer, 0.51f);
  EXPECT_FLOAT_EQ(param, 1.0f - 0.051f);
  SgdUpdate(rule, c, 0.5f, &param, &buffer);
  const float d_p = 0.5f + 0.01f * (1.0f - 0.051f);
  EXPECT_FLOAT_EQ(buffer, 0.9f * 0.51f + d_p);
  EXPECT_FLOAT_EQ(param, 1.0f - 0.051f - 0.1f * (0.9f * 0.51f + d_p));
}

TEST(SgdUpdate, Nesterov_StepsAlongGradientPlusMomentumTimesBuffer) {
  UpdateRule rule;
  rule.lr = 0.5;
  rule.momentum = 0.5f;
  rule.nesterov = true;
  const UpdateCoefficients c = PrepareUpdate(rule, AfterSteps(1, 0));
  float param = 1.0f, buffer = 0.0f;
  SgdUpdate(rule, c, 2.0f, &param, &buffer);
  // buf = 2; d_p = 2 + 0.5 * 2 = 3; p = 1 - 0.5 * 3
  EXPECT_EQ(buffer, 2.0f);
  EXPECT_EQ(param, -0.5f);
  SgdUpdate(rule, c, 2.0f, &param, &buffer);
  // buf = 0.5 * 2 + 2 = 3; d_p = 2 + 0.5 * 3 = 3.5; p = -0.5 - 1.75
  EXPECT_EQ(buffer, 3.0f);
  EXPECT_EQ(param, -2.25f);
}

// Adam from its definition in double: m_t = b1 m + (1 - b1) g, v_t = b2 v + (1 - b2) g²,
// p -= lr / (1 - b1^t) · m_t / (sqrt(v_t) / sqrt(1 - b2^t) + eps).
struct ReferenceAdam {
  double p, m = 0, v = 0;
  int t = 0;
  void Step(double g, double lr, double b1, double b2, double eps, double wd, bool decoupled) {
    ++t;
    if (decoupled) {
      p *= 1 - lr * wd;
    } else {
      g += wd * p;
    }
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    p -= lr / (1 - std::pow(b1, t)) * m / (std::sqrt(v) / std::sqrt(1 - std::pow(b2, t)) + eps);
  }
};

class AdamUpdateTest : public ::testing::TestWithParam<bool> {};

TEST_P(AdamUpdateTest, FollowsTheDefinitionWithBiasCorrection_AndSkipsDoNotAdvanceT) {
  const bool decoupled = GetParam();
  UpdateRule rule;
  rule.kind = UpdateKind::kAdam;
  rule.lr = 0.01;
  rule.weight_decay = 0.1f;
  rule.weight_decay_d = 0.1;
  rule.decoupled_weight_decay = decoupled;
  ReferenceAdam reference{0.7};
  float param = 0.7f, exp_avg = 0, exp_avg_sq = 0;
  const float grads[] = {0.3f, -1.2f, 0.05f, 2.0f, -0.4f};
  int64_t done = 0, skipped = 0;
  for (int i = 0; i < 5; ++i) {
    // A skipped step in the middle: t counts applied steps only.
    if (i == 2) {
      ++done;
      ++skipped;
    }
    ++done;
    const UpdateCoefficients c = PrepareUpdate(rule, AfterSteps(done, skipped));
    AdamUpdate(rule, c, grads[i], &param, &exp_avg, &exp_avg_sq);
    reference.Step(grads[i], 0.01, 0.9, 0.999, 1e-8, 0.1, decoupled);
    EXPECT_NEAR(param, reference.p, 1e-6 * std::fabs(reference.p)) << "step " << i + 1;
    EXPECT_NEAR(exp_avg, reference.m, 1e-6 * std::fabs(reference.m) + 1e-12);
    EXPECT_NEAR(exp_avg_sq, reference.v, 1e-6 * std::fabs(reference.v) + 1e-12);
  }
}

INSTANTIATE_TEST_SUITE_P(L2AndDecoupled, AdamUpdateTest, ::testing::Bool());

TEST(AdamUpdate, FirstStepMovesEachParameterByAboutLr) {
  UpdateRule rule;
  rule.kind = UpdateKind::kAdam;
  rule.lr = 0.001;
  const UpdateCoefficients c = PrepareUpdate(rule, AfterSteps(1, 0));
  for (float g : {1e-3f, 1.0f, -50.0f}) {
    float param = 0, m = 0, v = 0;
    AdamUpdate(rule, c, g, &param, &m, &v);
    EXPECT_NEAR(param, g > 0 ? -0.001f : 0.001f, 1e-6f) << "g " << g;
  }
}

}  // namespace
}  // namespace mptrain
