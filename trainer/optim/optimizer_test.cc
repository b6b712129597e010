// Weight-decay groups: each span of parameters is updated exactly as an optimizer over only
// decaying (or only non-decaying) parameters would update it.

#include "trainer/optim/optimizer.h"

#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_collectives.h"

namespace mptrain {
namespace {

TEST(DecaySpansOf, JoinsNeighboursOfOneGroup) {
  ParameterTable table;
  table.Add("wte", {2, 2});
  table.Add("wpe", {1, 2});
  table.Add("ln.weight", {2}, /*weight_decay=*/false);
  table.Add("ln.bias", {2}, /*weight_decay=*/false);
  table.Add("fc.weight", {2, 2});
  const std::vector<DecaySpan> spans = DecaySpansOf(table);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].end, 6);
  EXPECT_TRUE(spans[0].decay);
  EXPECT_EQ(spans[1].begin, 6);
  EXPECT_EQ(spans[1].end, 10);
  EXPECT_FALSE(spans[1].decay);
  EXPECT_EQ(spans[2].end, 14);
}

// Runs two AdamW steps over 6 parameters with the given spans; returns the parameters.
std::vector<float> TwoSteps(std::vector<DecaySpan> spans) {
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  OptimizerConfig config;
  config.type = OptimizerType::kAdamW;
  config.weight_decay = 0.5;
  std::unique_ptr<Optimizer> optimizer = *MakeOptimizer(config, &backend, 6, std::move(spans));
  const std::vector<float> initial = {1, -2, 3, -4, 5, -6}, grad = {0.1f, 0.2f, -0.3f, 0, 1, 2};
  Tensor params = *backend.Allocate(DType::kF32, 1, 6);
  Tensor grads = *backend.Allocate(DType::kF32, 1, 6);
  EXPECT_TRUE(backend.Upload(initial.data(), params).ok());
  EXPECT_TRUE(backend.Upload(grad.data(), grads).ok());
  StepState state;
  state.scale = 1;
  state.last_scale = 1;
  state.clip_coef = 1;
  for (int step = 1; step <= 2; ++step) {
    state.steps_done = step;
    StepStateBuffer buffer = *backend.AllocateStepState(state);
    EXPECT_TRUE(optimizer->Update(0.1, params, grads, buffer, Tensor{}).ok());
  }
  std::vector<float> out(6);
  EXPECT_TRUE(backend.Download(params, out.data()).ok());
  return out;
}

TEST(UpdateInSpans, DecaysOnlyTheDecayingSpans) {
  const std::vector<float> all = TwoSteps({});
  const std::vector<float> none = TwoSteps({{0, 6, false}});
  const std::vector<float> mixed = TwoSteps({{0, 2, true}, {2, 5, false}, {5, 6, true}});
  for (int i = 0; i < 6; ++i) {
    const bool decays = i < 2 || i == 5;
    EXPECT_EQ(mixed[i], decays ? all[i] : none[i]) << i;
    EXPECT_NE(all[i], none[i]) << i << ": the decay must show";
  }
}

}  // namespace
}  // namespace mptrain
