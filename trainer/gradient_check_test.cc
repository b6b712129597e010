// Gradient check of the MLP on the CPU backend in fp32: the backward pass must match central
// finite differences of the forward loss, for every parameter, with ReLU and GELU.

#include <cmath>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_collectives.h"
#include "trainer/loss/mse.h"
#include "trainer/mlp.h"

namespace mptrain {
namespace {

class GradientCheck : public ::testing::TestWithParam<ActivationKind> {};

TEST_P(GradientCheck, BackwardMatchesFiniteDifferences) {
  ModelConfig model;
  model.widths = {5, 7, 6, 3};
  model.activation = GetParam();
  const int64_t batch = 4;
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  auto mlp = Mlp::Create(&backend, model, DType::kF32, batch);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  const int64_t n = (*mlp)->layout().total;

  std::mt19937 generator(7);
  std::normal_distribution<float> normal;
  std::vector<float> params(n), x(batch * 5), y(batch * 3);
  for (float& v : params) v = 0.5f * normal(generator);
  for (float& v : x) v = normal(generator);
  for (float& v : y) v = normal(generator);
  auto xt = backend.Allocate(DType::kF32, batch, 5);
  auto yt = backend.Allocate(DType::kF32, batch, 3);
  StepState unit_scale;
  unit_scale.scale = 1.0f;
  auto state = backend.AllocateStepState(unit_scale);
  ASSERT_TRUE(backend.Upload(x.data(), *xt).ok());
  ASSERT_TRUE(backend.Upload(y.data(), *yt).ok());

  // Loss (and gradients) at the given parameters: accumulation 1, scale 1.
  auto loss_at = [&](const std::vector<float>& p, std::vector<float>* grads) {
    EXPECT_TRUE(backend.Upload(p.data(), (*mlp)->params()).ok());
    EXPECT_TRUE(backend.Zero((*mlp)->grads()).ok());
    EXPECT_TRUE((*mlp)->Forward(*xt).ok());
    EXPECT_TRUE(MseLoss(&backend, 3, 1).Backward((*mlp)->output(), *yt, *state, (*mlp)->metrics(),
                                                 (*mlp)->output_grad()).ok());
    EXPECT_TRUE((*mlp)->Backward(/*micro_batch=*/0).ok());
    std::vector<float> all(n + 2);
    EXPECT_TRUE(backend.Download((*mlp)->grads(), all.data()).ok());
    if (grads != nullptr) grads->assign(all.begin(), all.begin() + n);
    return static_cast<double>(all[n]);
  };

  std::vector<float> analytic;
  loss_at(params, &analytic);
  const float eps = 1e-2f;
  int checked = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> plus = params, minus = params;
    plus[i] += eps;
    minus[i] -= eps;
    const double numeric = (loss_at(plus, nullptr) - loss_at(minus, nullptr)) / (2 * eps);
    EXPECT_NEAR(analytic[i], numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << "parameter " << i;
    ++checked;
  }
  EXPECT_EQ(checked, n);
}

INSTANTIATE_TEST_SUITE_P(Activations, GradientCheck,
                         ::testing::Values(ActivationKind::kRelu, ActivationKind::kGelu));

}  // namespace
}  // namespace mptrain
