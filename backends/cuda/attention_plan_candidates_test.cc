#include "backends/cuda/attention_plan_candidates.h"

#include <vector>

#include "gtest/gtest.h"

namespace mptrain::cuda {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(AttentionPlanCandidates, KeepsTheFirstUpToTheLimitInTheHeuristicsOrder) {
  AttentionPlanCandidates candidates(3, 64 * kMiB);
  for (int64_t plan = 0; plan < 5 && !candidates.Full(); ++plan) candidates.Offer(plan, 256);
  EXPECT_EQ(candidates.plans(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(candidates.Full());
  EXPECT_EQ(candidates.workspace_bytes(), 256);
  candidates.Offer(7, 0);  // Full: not kept.
  EXPECT_EQ(candidates.plans().size(), 3u);
}

TEST(AttentionPlanCandidates, DropsPlansWantingMoreWorkspaceThanTheFirstOrTheFloor) {
  // The H100's backward at B=32 T=1024 H=12 hs=64: the first 97.5 MiB, the others 193.5 MiB.
  AttentionPlanCandidates backward(8, 64 * kMiB);
  backward.Offer(0, 102236416);
  backward.Offer(1, 202899584);
  backward.Offer(2, 202899584);
  EXPECT_EQ(backward.plans(), (std::vector<int64_t>{0}));
  EXPECT_EQ(backward.workspace_bytes(), 102236416);

  // Below the floor any plan up to the floor is kept, and the workspace is the largest kept.
  AttentionPlanCandidates forward(8, 64 * kMiB);
  forward.Offer(0, 0);
  forward.Offer(1, 32 * kMiB);
  forward.Offer(2, 65 * kMiB);
  forward.Offer(3, 64 * kMiB);
  EXPECT_EQ(forward.plans(), (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(forward.workspace_bytes(), 64 * kMiB);
}

TEST(AttentionPlanCandidates, PlansThatDidNotBuildAreSkippedAndTheBoundComesFromTheFirstOffered) {
  // Plan 0 did not build (never offered): plan 1 sets the bound.
  AttentionPlanCandidates candidates(8, 0);
  candidates.Offer(1, 10 * kMiB);
  candidates.Offer(2, 11 * kMiB);
  candidates.Offer(3, 9 * kMiB);
  candidates.Offer(4, -1);  // A workspace size that could not be read.
  EXPECT_EQ(candidates.plans(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(candidates.workspace_bytes(), 10 * kMiB);
}

TEST(AttentionPlanCandidates, ALimitBelowOneKeepsOne) {
  AttentionPlanCandidates candidates(0, 0);
  candidates.Offer(5, 0);
  candidates.Offer(6, 0);
  EXPECT_EQ(candidates.plans(), (std::vector<int64_t>{5}));
}

}  // namespace
}  // namespace mptrain::cuda
