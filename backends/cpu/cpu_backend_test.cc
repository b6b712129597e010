#include "backends/cpu/cpu_backend.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/fake_collectives.h"

namespace mptrain {
namespace {

class CpuBackendTest : public ::testing::Test {
 protected:
  CpuBackendTest() : backend_(std::make_unique<testing::SingleRankCollective>()) {}

  Tensor Make(DType dtype, int64_t rows, int64_t cols, const std::vector<float>& values) {
    Tensor tensor = *backend_.Allocate(dtype, rows, cols);
    EXPECT_TRUE(backend_.Upload(values.data(), tensor).ok());
    return tensor;
  }

  std::vector<float> Read(Tensor tensor) {
    std::vector<float> values(tensor.numel());
    EXPECT_TRUE(backend_.Download(tensor, values.data()).ok());
    return values;
  }

  CpuBackend backend_;
};

TEST_F(CpuBackendTest, Upload_RoundsToTheTensorDtype) {
  Tensor half = Make(DType::kF16, 1, 2, {1.0f + 1e-4f, 70000.0f});
  std::vector<float> values = Read(half);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_TRUE(std::isinf(values[1]));
}

TEST_F(CpuBackendTest, LinearForward_AddsBiasAppliesReluAndRoundsOnce) {
  // x [1, 2] · wᵀ (w [2, 2]) + b
  Tensor x = Make(DType::kF16, 1, 2, {1.0f, 2.0f});
  Tensor w = Make(DType::kF16, 2, 2, {1.0f, 1.0f, -1.0f, -1.0f});
  Tensor b = Make(DType::kF16, 1, 2, {0.0009765625f, 0.5f});  // 2^-10
  Tensor pre = *backend_.Allocate(DType::kF16, 1, 2);
  Tensor y = *backend_.Allocate(DType::kF16, 1, 2);
  ASSERT_TRUE(backend_.LinearForward(x, w, b, ActivationKind::kRelu, pre, y).ok());
  // 3 + 2^-10 is not an fp16 number (spacing 2^-9 at 3): rounds to even, 3.
  EXPECT_EQ(Read(pre), (std::vector<float>{3.0f, -2.5f}));
  EXPECT_EQ(Read(y), (std::vector<float>{3.0f, 0.0f}));
}

TEST_F(CpuBackendTest, ScaledDifference_ReadsTheSeedFromTheStepState) {
  Tensor a = Make(DType::kF16, 1, 2, {1.0f, 3.0f});
  Tensor b = Make(DType::kF32, 1, 2, {0.0f, 0.5f});
  StepState initial;
  initial.scale = 8.0f;
  StepStateBuffer state = *backend_.AllocateStepState(initial);
  Tensor out = *backend_.Allocate(DType::kF16, 1, 2);
  // coef 0.5 * (a - b) * (8 / 4)
  ASSERT_TRUE(backend_.ScaledDifference(a, b, 0.5f, state, 4.0f, out).ok());
  EXPECT_EQ(Read(out), (std::vector<float>{1.0f, 2.5f}));
}

TEST_F(CpuBackendTest, SumSquaredDifference_AccumulatesMeanOverDivisor) {
  Tensor a = Make(DType::kF32, 1, 2, {1.0f, 3.0f});
  Tensor b = Make(DType::kF32, 1, 2, {0.0f, 0.0f});
  Tensor acc = Make(DType::kF32, 1, 1, {1.0f});
  ASSERT_TRUE(backend_.SumSquaredDifference(a, b, 2.0, 4.0f, acc).ok());
  EXPECT_FLOAT_EQ(Read(acc)[0], 1.0f + (1.0f + 9.0f) / 2 / 4);
}

TEST_F(CpuBackendTest, LogSoftmaxRows_AndExp_GiveRowsThatSumToOne) {
  Tensor x = Make(DType::kF16, 2, 3, {1.0f, 2.0f, 3.0f, 1000.0f, 0.0f, -1000.0f});
  Tensor log_probs = *backend_.Allocate(DType::kF32, 2, 3);
  Tensor probs = *backend_.Allocate(DType::kF32, 2, 3);
  ASSERT_TRUE(backend_.LogSoftmaxRows(x, log_probs).ok());
  ASSERT_TRUE(backend_.Exp(log_probs, probs).ok());
  const std::vector<float> lp = Read(log_probs), p = Read(probs);
  const double log_sum = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(lp[0], 1.0 - log_sum, 1e-6);
  EXPECT_NEAR(lp[2], 3.0 - log_sum, 1e-6);
  EXPECT_NEAR(p[0] + p[1] + p[2], 1.0, 1e-6);
  EXPECT_EQ(lp[3], 0.0f) << "large logits do not overflow";
  EXPECT_EQ(p[5], 0.0f);
}

TEST_F(CpuBackendTest, SmoothedOneHot_AndSumProduct_GiveSmoothedCrossEntropy) {
  Tensor ids = Make(DType::kF32, 2, 1, {2.0f, 0.0f});
  Tensor q = *backend_.Allocate(DType::kF32, 2, 3);
  ASSERT_TRUE(backend_.SmoothedOneHot(ids, 0.7f, 0.1f, q).ok());
  EXPECT_EQ(Read(q), (std::vector<float>{0.1f, 0.1f, 0.8f, 0.8f, 0.1f, 0.1f}));
  Tensor log_probs = Make(DType::kF32, 2, 3, {-1.0f, -2.0f, -3.0f, -4.0f, -5.0f, -6.0f});
  Tensor acc = Make(DType::kF32, 1, 1, {0.0f});
  ASSERT_TRUE(backend_.SumProduct(q, log_probs, -2.0, 4.0f, acc).ok());
  const double expected = (0.1 * 1 + 0.1 * 2 + 0.8 * 3 + 0.8 * 4 + 0.1 * 5 + 0.1 * 6) / 2 / 4;
  EXPECT_NEAR(Read(acc)[0], expected, 1e-6);
}

TEST_F(CpuBackendTest, CountArgmaxMatches_TakesTheFirstMaximum) {
  Tensor x = Make(DType::kF32, 3, 3, {0, 5, 5, 9, 1, 2, 0, 0, 1});
  Tensor ids = Make(DType::kF32, 3, 1, {2, 0, 2});
  Tensor acc = Make(DType::kF32, 1, 1, {1.0f});
  ASSERT_TRUE(backend_.CountArgmaxMatches(x, ids, acc).ok());
  EXPECT_EQ(Read(acc)[0], 3.0f) << "row 0's first maximum is column 1, not 2";
}

// The three phases of a step, as the loop runs them.
struct StepResult {
  std::vector<float> params;
  StepState state;
};

TEST_F(CpuBackendTest, Step_OnInfSkipsUpdateAndBacksOff) {
  Tensor params = Make(DType::kF32, 1, 2, {1.0f, 2.0f});
  Tensor grads = Make(DType::kF32, 1, 2, {INFINITY, 1.0f});
  Tensor loss = Make(DType::kF32, 1, 2, {0.5f, 0.0f});
  Tensor momentum = *backend_.Allocate(DType::kF32, 1, 2);
  StepState initial;
  initial.scale = 4.0f;
  StepStateBuffer state = *backend_.AllocateStepState(initial);
  StepConfig config;
  config.scaler_enabled = true;
  UpdateRule rule;
  rule.lr = 0.1;
  ASSERT_TRUE(backend_.GradientStatistics(grads, state).ok());
  ASSERT_TRUE(backend_.FinalizeStep(config, loss, state).ok());
  ASSERT_TRUE(backend_.UpdateParameters(rule, params, grads, momentum, Tensor{}, state, Tensor{})
                  .ok());
  EXPECT_EQ(Read(params), (std::vector<float>{1.0f, 2.0f}));
  StepState after = *backend_.ReadStepState(state);
  EXPECT_EQ(after.skipped, 1);
  EXPECT_EQ(after.scale, 2.0f);
  EXPECT_EQ(after.last_loss, 0.5f);
}

TEST_F(CpuBackendTest, Step_UnscalesThenSteps) {
  Tensor params = Make(DType::kF32, 1, 2, {1.0f, 2.0f});
  Tensor grads = Make(DType::kF32, 1, 2, {4.0f, -8.0f});
  Tensor loss = Make(DType::kF32, 1, 2, {0.0f, 0.0f});
  Tensor momentum = *backend_.Allocate(DType::kF32, 1, 2);
  Tensor low = *backend_.Allocate(DType::kBF16, 1, 2);
  StepState initial;
  initial.scale = 4.0f;
  StepStateBuffer state = *backend_.AllocateStepState(initial);
  StepConfig config;
  config.scaler_enabled = true;
  UpdateRule rule;
  rule.lr = 0.5;
  ASSERT_TRUE(backend_.GradientStatistics(grads, state).ok());
  ASSERT_TRUE(backend_.FinalizeStep(config, loss, state).ok());
  ASSERT_TRUE(backend_.UpdateParameters(rule, params, grads, momentum, Tensor{}, state, low).ok());
  EXPECT_EQ(Read(params), (std::vector<float>{0.5f, 3.0f}));
  EXPECT_EQ(Read(low), (std::vector<float>{0.5f, 3.0f}));
  EXPECT_FLOAT_EQ(backend_.ReadStepState(state)->last_grad_norm, std::sqrt(5.0f));
}

TEST_F(CpuBackendTest, CopyRowsWrapping_WrapsAroundTheEnd) {
  Tensor src = Make(DType::kF32, 3, 1, {1, 2, 3});
  Tensor dst = *backend_.Allocate(DType::kF32, 2, 1);
  ASSERT_TRUE(backend_.CopyRowsWrapping(src, 2, dst).ok());
  EXPECT_EQ(Read(dst), (std::vector<float>{3, 1}));
}

}  // namespace
}  // namespace mptrain
