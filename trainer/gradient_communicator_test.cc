#include "trainer/gradient_communicator.h"

#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gloo_collective.h"
#include "gtest/gtest.h"
#include "tests/fake_collectives.h"
#include "trainer/in_memory_store.h"
#include "trainer/precision.h"

namespace mptrain {
namespace {

constexpr int64_t kParams = 6;  // Then the 2 metric slots.

// Each rank's gradients (already multiplied by the loss scale, as on the stepping micro-batch).
std::vector<float> RankGrads(int rank) {
  if (rank == 0) return {1.0f, 1.0001f, -3.3f, 70000.0f, 1e-8f, 0.1f, /*metrics*/ 2.0f, 5.0f};
  return {1.0f, 0.0004f, 3.3f, 70000.0f, 3e-8f, 0.2f, /*metrics*/ 4.0f, 1.0f};
}

// Runs two ranks over gloo: each hands its gradients in `spans` ([offset, end) pairs covering
// all 8 elements) to a communicator of `wire` dtype, then Finish(); returns rank 0's result.
std::vector<float> ReduceOnTwoRanks(DType wire,
                                    const std::vector<std::pair<int64_t, int64_t>>& spans) {
  InMemoryKeyValueStore store;
  std::vector<float> results[2];
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      auto collective = GlooCollective::Connect(rank, 2, "127.0.0.1", &store, 20'000);
      ASSERT_TRUE(collective.ok()) << collective.status();
      CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
      auto grads = backend.Allocate(DType::kF32, 1, kParams + 2);
      ASSERT_TRUE(grads.ok());
      std::vector<float> host = RankGrads(rank);
      ASSERT_TRUE(backend.Upload(host.data(), *grads).ok());
      auto communicator =
          GradientCommunicator::Create(&backend, collective->get(), wire, *grads, kParams);
      ASSERT_TRUE(communicator.ok()) << communicator.status();
      for (const auto& [offset, end] : spans) {
        ASSERT_TRUE((*communicator)->Start(grads->FlatView(offset, 1, end - offset)).ok());
      }
      absl::Status finished = (*communicator)->Finish();
      ASSERT_TRUE(finished.ok()) << finished;
      results[rank].resize(kParams + 2);
      ASSERT_TRUE(backend.Download(*grads, results[rank].data()).ok());
    });
  }
  for (auto& rank : ranks) rank.join();
  EXPECT_EQ(results[0], results[1]) << "every rank holds the same reduced gradients";
  return results[0];
}

// DDP's compress hook, element by element: round(round(a) / 2) + round(round(b) / 2), the sum
// rounded, in `dtype`.
float HookResult(DType dtype, float a, float b) {
  auto compress = [dtype](float g) { return RoundTo(dtype, RoundTo(dtype, g) / 2.0f); };
  return RoundTo(dtype, compress(a) + compress(b));
}

TEST(GradientCommunicator, F32_IsTheMeanOfTheFp32Gradients) {
  const std::vector<float> reduced = ReduceOnTwoRanks(DType::kF32, {{0, 4}, {4, 8}});
  for (int64_t i = 0; i < kParams + 2; ++i) {
    EXPECT_FLOAT_EQ(reduced[i], (RankGrads(0)[i] + RankGrads(1)[i]) / 2) << i;
  }
}

TEST(GradientCommunicator, F16_IsDdpsFp16CompressHook_MetricsStayFp32) {
  // Spans as the reducer hands them: the last layer's bucket with the metric slots first.
  const std::vector<float> reduced = ReduceOnTwoRanks(DType::kF16, {{3, 8}, {0, 3}});
  for (int64_t i = 0; i < kParams; ++i) {
    EXPECT_EQ(reduced[i], HookResult(DType::kF16, RankGrads(0)[i], RankGrads(1)[i])) << i;
  }
  // Where fp16 shows: 70000 overflows fp16 (an inf, so the scaler skips the step, as PyTorch's
  // does); 1e-8 and 3e-8 vanish; 1.0001 + 0.0004 lands on fp16's grid.
  EXPECT_TRUE(std::isinf(reduced[3]));
  EXPECT_EQ(reduced[4], 0.0f);
  EXPECT_NE(reduced[1], (1.0001f + 0.0004f) / 2);
  EXPECT_FLOAT_EQ(reduced[6], 3.0f) << "the loss is averaged in fp32";
  EXPECT_FLOAT_EQ(reduced[7], 3.0f) << "the correct count is averaged in fp32";
}

TEST(GradientCommunicator, BF16_IsDdpsBf16CompressHook) {
  const std::vector<float> reduced = ReduceOnTwoRanks(DType::kBF16, {{0, 8}});
  for (int64_t i = 0; i < kParams; ++i) {
    EXPECT_EQ(reduced[i], HookResult(DType::kBF16, RankGrads(0)[i], RankGrads(1)[i])) << i;
  }
  EXPECT_FALSE(std::isinf(reduced[3])) << "bf16 has fp32's range";
  EXPECT_EQ(reduced[2], 0.0f) << "-3.3 and 3.3 round alike: their sum is exactly 0";
  EXPECT_NE(reduced[1], (1.0001f + 0.0004f) / 2) << "1.0001 is 1 in bf16";
  EXPECT_FLOAT_EQ(reduced[6], 3.0f);
}

TEST(GradientCommunicator, SpansThatMissGradients_AreAnInternalError) {
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  testing::SingleRankCollective collective;
  auto grads = backend.Allocate(DType::kF32, 1, kParams + 2);
  ASSERT_TRUE(grads.ok());
  auto communicator =
      GradientCommunicator::Create(&backend, &collective, DType::kF16, *grads, kParams);
  ASSERT_TRUE(communicator.ok());
  ASSERT_TRUE((*communicator)->Start(grads->FlatView(2, 1, 6)).ok());
  absl::Status finished = (*communicator)->Finish();
  EXPECT_EQ(finished.code(), absl::StatusCode::kInternal) << finished;
  EXPECT_NE(finished.message().find("covered 4 of 6"), std::string::npos) << finished;
}

}  // namespace
}  // namespace mptrain
