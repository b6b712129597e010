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

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(PlaceRanks, CoLocatedWorkers_ShareTheirMachinesMemory) {
  // Two one-slot workers on machine m1 (23.5 GiB): one 18.2 GiB rank fits, two do not.
  const std::vector<WorkerSlots> workers = {{"a", {0}, "m1"}, {"b", {0}, "m1"}};
  MachineMemory memory{static_cast<int64_t>(18.2 * kGiB), {{"m1", static_cast<int64_t>(23.5 * kGiB)}}};
  EXPECT_FALSE(PlaceRanks(2, workers, {}, memory).has_value());
  auto one = PlaceRanks(1, workers, {}, memory);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ((*one)[0].worker_id, "a");
  // Small ranks fit both.
  memory.rank_memory_bytes = 10 * kGiB;
  auto two = PlaceRanks(2, workers, {}, memory);
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ((*two)[1].worker_id, "b");
}

TEST(PlaceRanks, FullMachine_SpillsToAnotherMachine) {
  // m1 holds one more 4 GiB rank; the rest of the job goes to m2's worker.
  const std::vector<WorkerSlots> workers = {{"a", {0, 1, 2}, "m1"}, {"c", {0, 1}, "m2"}};
  const MachineMemory memory{4 * kGiB, {{"m1", 5 * kGiB}, {"m2", 8 * kGiB}}};
  auto placement = PlaceRanks(3, workers, {}, memory);
  ASSERT_TRUE(placement.has_value());
  EXPECT_EQ((*placement)[0].worker_id, "a");
  EXPECT_EQ((*placement)[1].worker_id, "c");
  EXPECT_EQ((*placement)[2].worker_id, "c");
  EXPECT_FALSE(PlaceRanks(4, workers, {}, memory).has_value()) << "m2 holds only two";
}

TEST(PlaceRanks, MachineNotListed_IsNotBoundByMemory) {
  const std::vector<WorkerSlots> workers = {{"a", {0, 1}, "unknown"}, {"b", {0}, ""}};
  const MachineMemory memory{100 * kGiB, {{"m1", 0}}};
  EXPECT_TRUE(PlaceRanks(3, workers, {}, memory).has_value());
}

TEST(PlaceRanks, Rank0Worker_WithoutRoomOnItsMachine_ReturnsNothing) {
  const std::vector<WorkerSlots> workers = {{"holder", {0}, "m1"}, {"other", {0, 1}, "m2"}};
  const MachineMemory memory{4 * kGiB, {{"m1", 3 * kGiB}, {"m2", 8 * kGiB}}};
  EXPECT_FALSE(PlaceRanks(1, workers, {"holder"}, memory).has_value());
  EXPECT_TRUE(PlaceRanks(1, workers, {"other"}, memory).has_value());
}

}  // namespace
}  // namespace mptrain
