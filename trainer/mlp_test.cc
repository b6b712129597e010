#include "trainer/mlp.h"

#include <random>

#include "backends/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_collectives.h"
#include "trainer/loss/mse.h"

namespace mptrain {
namespace {

// The spans handed to the allreduce hook must cover every gradient (and the loss slot) exactly
// once, and computing the last layer in chunks must give the same gradients.
TEST(MlpBackward, LargeLastLayerInChunks_SameGradientsAndSpansCoverEverything) {
  ModelConfig model;
  model.widths = {8192, 4096};  // 8192 x 4096 fp32 = 128 MiB: two 64 MiB chunks
  const int64_t batch = 2;
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  auto mlp = Mlp::Create(&backend, model, DType::kF16, batch);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  const int64_t n = (*mlp)->layout().total;
  std::mt19937 generator(2);
  std::normal_distribution<float> normal;
  std::vector<float> params(n), x(batch * 8192), y(batch * 4096);
  for (float& v : params) v = 0.01f * normal(generator);
  for (float& v : x) v = normal(generator);
  for (float& v : y) v = normal(generator);
  Tensor tx = *backend.Allocate(DType::kF32, batch, 8192);
  Tensor ty = *backend.Allocate(DType::kF32, batch, 4096);
  StepState unit;
  unit.scale = 1024;
  StepStateBuffer state = *backend.AllocateStepState(unit);
  ASSERT_TRUE(backend.Upload(params.data(), (*mlp)->params()).ok());
  ASSERT_TRUE(backend.Upload(x.data(), tx).ok());
  ASSERT_TRUE(backend.Upload(y.data(), ty).ok());
  ASSERT_TRUE((*mlp)->RefreshLowPrecisionWeights().ok());

  auto gradients = [&](const GradientReducer::SpanReady& hook) {
    EXPECT_TRUE(backend.Zero((*mlp)->grads()).ok());
    EXPECT_TRUE((*mlp)->Forward(tx).ok());
    EXPECT_TRUE(MseLoss(&backend, 4096, 1).Backward((*mlp)->output(), ty, state, (*mlp)->metrics(),
                                                    (*mlp)->output_grad()).ok());
    std::unique_ptr<GradientReducer> reducer;
    if (hook) reducer = *GradientReducer::Create((*mlp)->table(), (*mlp)->accumulator(), hook);
    EXPECT_TRUE((*mlp)->Backward(/*micro_batch=*/0, reducer.get()).ok());
    std::vector<float> grads(n + 2);
    EXPECT_TRUE(backend.Download((*mlp)->grads(), grads.data()).ok());
    return grads;
  };
  const std::vector<float> whole = gradients({});
  std::vector<int> covered(n + 2, 0);
  int spans = 0;
  const float* base = static_cast<const float*>((*mlp)->grads().data);
  const std::vector<float> chunked = gradients([&](Tensor span) {
    const int64_t offset = static_cast<const float*>(span.data) - base;
    for (int64_t i = 0; i < span.numel(); ++i) covered[offset + i] += 1;
    ++spans;
    return absl::OkStatus();
  });
  EXPECT_EQ(spans, 3) << "two weight chunks, then the biases with the metric slots";
  EXPECT_EQ(chunked, whole);
  for (int64_t i = 0; i < n + 2; ++i) ASSERT_EQ(covered[i], 1) << "element " << i;
}

TEST(MlpBackward, SmallModel_OneSpanCoveringEverything) {
  ModelConfig model;
  model.widths = {6, 5, 3};
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  auto mlp = Mlp::Create(&backend, model, DType::kF32, 2);
  ASSERT_TRUE(mlp.ok());
  Tensor tx = *backend.Allocate(DType::kF32, 2, 6);
  ASSERT_TRUE((*mlp)->Forward(tx).ok());
  std::vector<int64_t> sizes;
  auto reducer = GradientReducer::Create((*mlp)->table(), (*mlp)->accumulator(), [&](Tensor span) {
    sizes.push_back(span.numel());
    return absl::OkStatus();
  });
  ASSERT_TRUE(reducer.ok());
  ASSERT_TRUE((*mlp)->Backward(0, reducer->get()).ok());
  EXPECT_EQ(sizes, (std::vector<int64_t>{(*mlp)->layout().total + 2}));
}

// Keeping each micro-batch's low-precision gradients and summing them on the last micro-batch
// must give exactly the fp32 sums of adding them one micro-batch after the other.
TEST(MlpBackward, DeferredAccumulation_IsBitIdenticalToIncremental) {
  ModelConfig model;
  model.widths = {24, 16, 8};
  const int64_t batch = 4, accumulation = 3;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    std::vector<std::vector<float>> results;
    for (int64_t budget : {int64_t{0}, Mlp::kDeferredBudgetBytes}) {
      CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
      auto mlp = Mlp::Create(&backend, model, dtype, batch, accumulation, budget);
      ASSERT_TRUE(mlp.ok());
      EXPECT_EQ((*mlp)->defers_accumulation(), budget > 0);
      std::mt19937 generator(5);
      std::normal_distribution<float> normal;
      std::vector<float> params((*mlp)->layout().total);
      for (float& v : params) v = 0.3f * normal(generator);
      ASSERT_TRUE(backend.Upload(params.data(), (*mlp)->params()).ok());
      ASSERT_TRUE((*mlp)->RefreshLowPrecisionWeights().ok());
      StepState unit;
      unit.scale = 4096;
      StepStateBuffer state = *backend.AllocateStepState(unit);
      Tensor x = *backend.Allocate(DType::kF32, batch, 24);
      Tensor y = *backend.Allocate(DType::kF32, batch, 8);
      int spans = 0;
      auto reducer = GradientReducer::Create((*mlp)->table(), (*mlp)->accumulator(), [&](Tensor) {
        ++spans;
        return absl::OkStatus();
      });
      ASSERT_TRUE(reducer.ok());
      for (int64_t micro = 0; micro < accumulation; ++micro) {
        std::vector<float> xs(batch * 24), ys(batch * 8);
        for (float& v : xs) v = normal(generator);
        for (float& v : ys) v = normal(generator);
        ASSERT_TRUE(backend.Upload(xs.data(), x).ok());
        ASSERT_TRUE(backend.Upload(ys.data(), y).ok());
        ASSERT_TRUE((*mlp)->Forward(x).ok());
        ASSERT_TRUE(MseLoss(&backend, 8, accumulation)
                        .Backward((*mlp)->output(), y, state, (*mlp)->metrics(),
                                  (*mlp)->output_grad()).ok());
        ASSERT_TRUE((*mlp)->Backward(micro, reducer->get()).ok());
      }
      EXPECT_EQ(spans, 1) << "spans are handed over on the last micro-batch only";
      std::vector<float> grads((*mlp)->layout().total + 2);
      ASSERT_TRUE(backend.Download((*mlp)->grads(), grads.data()).ok());
      results.push_back(grads);
    }
    EXPECT_EQ(results[0], results[1]) << "dtype " << static_cast<int>(dtype);
  }
}

}  // namespace
}  // namespace mptrain
