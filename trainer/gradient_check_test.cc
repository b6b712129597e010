// Gradient check of the MLP on the CPU backend in fp32: the backward pass must match central
// finite differences of the forward loss, for every parameter, with ReLU and GELU.

#include <cmath>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_collectives.h"
#include "trainer/loss/mse.h"
#include "trainer/mlp.h"
#include "trainer/mse_probe.h"

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
  testing::MseProbe probe(&backend, mlp->get(), x, y);
  ASSERT_TRUE(probe.ok());

  auto loss_at = [&](const std::vector<float>& p, std::vector<float>* grads) {
    return probe.LossAt(p, grads);
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
