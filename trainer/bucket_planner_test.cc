#include "trainer/bucket_planner.h"

#include <cstdint>
#include <limits>
#include <numeric>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(PlanBuckets, SmallGroups_ShareOneBucket) {
  auto buckets = PlanBuckets({100, 200, 300}, 25 * kMiB);
  ASSERT_TRUE(buckets.ok());
  EXPECT_EQ(*buckets, (std::vector<PlannedBucket>{{0, 2, 600}}));
}

TEST(PlanBuckets, GroupsThatOverflowTheCap_StartANewBucket) {
  // 16 MiB + 16 MiB > 25 MiB: two buckets; the 1 MiB after joins the second.
  auto buckets = PlanBuckets({16 * kMiB, 16 * kMiB, 1 * kMiB}, 25 * kMiB);
  ASSERT_TRUE(buckets.ok());
  EXPECT_EQ(*buckets, (std::vector<PlannedBucket>{{0, 0, 16 * kMiB}, {1, 2, 17 * kMiB}}));
}

TEST(PlanBuckets, ExactlyTheCap_StaysInOneBucket) {
  auto buckets = PlanBuckets({10, 15}, 25);
  ASSERT_TRUE(buckets.ok());
  EXPECT_EQ(*buckets, (std::vector<PlannedBucket>{{0, 1, 25}}));
}

TEST(PlanBuckets, GroupLargerThanTheCap_IsABucketAlone) {
  auto buckets = PlanBuckets({1, 100, 1}, 10);
  ASSERT_TRUE(buckets.ok());
  EXPECT_EQ(*buckets, (std::vector<PlannedBucket>{{0, 0, 1}, {1, 1, 100}, {2, 2, 1}}));
}

TEST(PlanBuckets, EveryGroupInExactlyOneBucket_InOrder) {
  std::vector<int64_t> sizes;
  for (int i = 0; i < 500; ++i) sizes.push_back((i * 7919) % 1000);
  auto buckets = PlanBuckets(sizes, 2500);
  ASSERT_TRUE(buckets.ok());
  size_t next = 0;
  for (const PlannedBucket& bucket : *buckets) {
    EXPECT_EQ(bucket.first, next);
    EXPECT_GE(bucket.last, bucket.first);
    const int64_t bytes =
        std::accumulate(sizes.begin() + bucket.first, sizes.begin() + bucket.last + 1, int64_t{0});
    EXPECT_EQ(bucket.bytes, bytes);
    EXPECT_TRUE(bytes <= 2500 || bucket.first == bucket.last);
    next = bucket.last + 1;
  }
  EXPECT_EQ(next, sizes.size());
}

TEST(PlanBuckets, HugeSizes_DoNotOverflow) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  auto buckets = PlanBuckets({max - 1, max - 1}, max);
  ASSERT_TRUE(buckets.ok());
  EXPECT_EQ(buckets->size(), 2u);
}

TEST(PlanBuckets, NoGroups_NoBuckets) {
  auto buckets = PlanBuckets({}, 10);
  ASSERT_TRUE(buckets.ok());
  EXPECT_TRUE(buckets->empty());
}

TEST(PlanBuckets, BadInput_IsInvalidArgument) {
  EXPECT_EQ(PlanBuckets({1}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanBuckets({1, -1}, 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanBuckets(std::vector<int64_t>(kMaxPlannedGroups + 1, 1), 10).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlanRowChunks, SmallTensor_IsOneChunk) {
  auto chunks = PlanRowChunks(4096, 4 * 1024, 64 * kMiB);  // 16 MiB
  ASSERT_TRUE(chunks.ok());
  EXPECT_EQ(*chunks, (std::vector<RowRange>{{0, 4096}}));
}

TEST(PlanRowChunks, LargeTensor_SplitsRowsEvenly) {
  // 4096 rows of 8192 fp32 = 128 MiB: two chunks of 64 MiB.
  auto chunks = PlanRowChunks(4096, 4 * 8192, 64 * kMiB);
  ASSERT_TRUE(chunks.ok());
  EXPECT_EQ(*chunks, (std::vector<RowRange>{{0, 2048}, {2048, 2048}}));
  // 7 rows, 3 chunks: 2, 2, 3 rows.
  chunks = PlanRowChunks(7, 10, 23);
  ASSERT_TRUE(chunks.ok());
  EXPECT_EQ(*chunks, (std::vector<RowRange>{{0, 2}, {2, 2}, {4, 3}}));
}

TEST(PlanRowChunks, NeverMoreChunksThanRows) {
  auto chunks = PlanRowChunks(3, 1000, 1);
  ASSERT_TRUE(chunks.ok());
  EXPECT_EQ(*chunks, (std::vector<RowRange>{{0, 1}, {1, 1}, {2, 1}}));
}

TEST(PlanRowChunks, BadInput_IsInvalidArgument) {
  EXPECT_FALSE(PlanRowChunks(0, 4, 4).ok());
  EXPECT_FALSE(PlanRowChunks(4, 0, 4).ok());
  EXPECT_FALSE(PlanRowChunks(4, 4, 0).ok());
}

}  // namespace
}  // namespace mptrain
