#include "comm/lane_plan.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

void ExpectCovers(const std::vector<Stripe>& stripes, int64_t count, int64_t align) {
  int64_t next = 0;
  for (size_t i = 0; i < stripes.size(); ++i) {
    EXPECT_EQ(stripes[i].offset, next) << "slice " << i;
    EXPECT_GT(stripes[i].count, 0) << "slice " << i;
    EXPECT_EQ(stripes[i].offset % align, 0) << "slice " << i;
    next += stripes[i].count;
  }
  EXPECT_EQ(next, count);
}

TEST(LanePlan, ResolveLanes_OneWithinANode_FourAcrossNodes_TheJobsChoiceOtherwise) {
  EXPECT_EQ(ResolveLanes(0, {"h1", "h1", "h1"}), 1);
  EXPECT_EQ(ResolveLanes(0, {"h1"}), 1);
  EXPECT_EQ(ResolveLanes(0, {"h1", "h1", "h2"}), kCrossNodeLanes);
  EXPECT_EQ(ResolveLanes(2, {"h1", "h2"}), 2);
  EXPECT_EQ(ResolveLanes(1, {"h1", "h2"}), 1);
  EXPECT_EQ(ResolveLanes(3, {"h1", "h1"}), 3);
  EXPECT_EQ(ResolveLanes(100, {"h1"}), kMaxLanes);
}

TEST(LanePlan, LocalNodeId_IsNcclHostIdWhenSet) {
  ::setenv("NCCL_HOSTID", "gpu-as-host-1", 1);
  const std::string with_host_id = LocalNodeId();
  ::unsetenv("NCCL_HOSTID");
  EXPECT_EQ(with_host_id, "hostid:gpu-as-host-1");
  EXPECT_NE(LocalNodeId(), with_host_id);
  EXPECT_FALSE(LocalNodeId().empty());
}

TEST(LanePlan, PlanStripes_SmallBucketsStayWhole) {
  auto stripes = PlanStripes(1000, 4, 1 << 18, 64);
  ASSERT_EQ(stripes.size(), 1u);
  EXPECT_EQ(stripes[0].offset, 0);
  EXPECT_EQ(stripes[0].count, 1000);
  EXPECT_TRUE(PlanStripes(0, 4, 1, 1).empty());
}

TEST(LanePlan, PlanStripes_LargeBucketsSplitEvenlyOnAlignedBoundaries) {
  const int64_t count = 25'000'001;  // Not a multiple of anything.
  auto stripes = PlanStripes(count, 4, 1 << 18, 64);
  ASSERT_EQ(stripes.size(), 4u);
  ExpectCovers(stripes, count, 64);
  // Each share is rounded up to the alignment, so the last slice is short by under 4 x 64.
  for (const Stripe& stripe : stripes) EXPECT_NEAR(stripe.count, count / 4, 4 * 64);
}

TEST(LanePlan, PlanStripes_AsManySlicesAsKeepEachAboveTheMinimum) {
  auto stripes = PlanStripes(3 * (1 << 18) + 5, 8, 1 << 18, 64);
  EXPECT_EQ(stripes.size(), 3u);
  ExpectCovers(stripes, 3 * (1 << 18) + 5, 64);
  for (int lanes = 1; lanes <= kMaxLanes; ++lanes) {
    for (int64_t count : {1, 63, 64, 65, 4096, 1'000'003}) {
      auto plan = PlanStripes(count, lanes, 1000, 64);
      EXPECT_LE(plan.size(), static_cast<size_t>(lanes));
      ExpectCovers(plan, count, 64);
    }
  }
}

}  // namespace
}  // namespace mptrain
