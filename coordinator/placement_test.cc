#include "coordinator/placement.h"

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(PlaceRanks, TooFewSlots_ReturnsNothing) {
  EXPECT_FALSE(PlaceRanks(3, {{"a", {0}}, {"b", {1}}}).has_value());
  EXPECT_FALSE(PlaceRanks(1, {}).has_value());
}

TEST(PlaceRanks, PrefersWorkerWithMostFreeSlots) {
  auto placement = PlaceRanks(2, {{"small", {0}}, {"big", {3, 1}}});
  ASSERT_TRUE(placement.has_value());
  ASSERT_EQ(placement->size(), 2u);
  EXPECT_EQ((*placement)[0].worker_id, "big");
  EXPECT_EQ((*placement)[0].slot, 1);
  EXPECT_EQ((*placement)[1].worker_id, "big");
  EXPECT_EQ((*placement)[1].slot, 3);
}

TEST(PlaceRanks, SpansWorkers_WithConsecutiveRanks) {
  auto placement = PlaceRanks(3, {{"a", {0}}, {"b", {0, 1}}});
  ASSERT_TRUE(placement.has_value());
  EXPECT_EQ((*placement)[0].worker_id, "b");
  EXPECT_EQ((*placement)[1].worker_id, "b");
  EXPECT_EQ((*placement)[2].worker_id, "a");
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ((*placement)[rank].rank, rank);
}

TEST(PlaceRanks, Rank0Workers_PutsRankZeroThere) {
  auto placement = PlaceRanks(3, {{"big", {0, 1}}, {"holder", {2}}, {"other", {0}}}, {"holder"});
  ASSERT_TRUE(placement.has_value());
  EXPECT_EQ((*placement)[0].worker_id, "holder");
  EXPECT_EQ((*placement)[0].slot, 2);
  EXPECT_EQ((*placement)[1].worker_id, "big");
  EXPECT_EQ((*placement)[2].worker_id, "big");
}

TEST(PlaceRanks, Rank0WorkersBusy_ReturnsNothing) {
  EXPECT_FALSE(PlaceRanks(2, {{"a", {0, 1}}, {"holder", {}}}, {"holder"}).has_value());
  EXPECT_FALSE(PlaceRanks(1, {{"a", {0, 1}}}, {"gone"}).has_value());
}

}  // namespace
}  // namespace mptrain
