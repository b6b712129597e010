#include "coordinator/rank_logs.h"

#include <limits>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(RankLogs, AppendsChunks_SkipsRetries_AndReadsFromAnOffset) {
  RankLogs logs;
  ASSERT_TRUE(logs.Append(1, 0, 0, "hello ").ok());
  ASSERT_TRUE(logs.Append(1, 0, 0, "hello ").ok());  // A retry.
  ASSERT_TRUE(logs.Append(1, 0, 3, "lo world\n").ok());  // Overlaps.
  auto all = logs.Read(0, 0, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->attempt(), 1);
  EXPECT_EQ(all->data(), "hello world\n");
  EXPECT_EQ(all->end_offset(), 12);
  EXPECT_FALSE(all->complete());
  auto rest = logs.Read(1, 0, 6);
  EXPECT_EQ(rest->data(), "world\n");
  logs.MarkComplete(1, 0);
  EXPECT_TRUE(logs.Read(1, 0, 12)->complete());
  EXPECT_TRUE(logs.Read(1, 0, 12)->data().empty());
  EXPECT_EQ(logs.Read(1, 1, 0).status().code(), absl::StatusCode::kNotFound);
}

TEST(RankLogs, OffsetPastTheLargestEnd_IsInvalid) {
  RankLogs logs;
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(logs.Append(1, 0, max - 2, "abc").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(logs.Append(1, 0, -1, "abc").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(logs.Append(1, 0, max - 3, "abc").ok());
}

TEST(RankLogs, KeepsTheNewestBytes_AndTwoAttempts) {
  RankLogs logs;
  const std::string chunk(RankLogs::kMaxChunkBytes, 'a');
  ASSERT_TRUE(logs.Append(1, 0, 0, chunk).ok());
  ASSERT_TRUE(logs.Append(1, 0, chunk.size(), std::string(10, 'b')).ok());
  auto tail = logs.Read(1, 0, 0);
  EXPECT_EQ(tail->data().size(), RankLogs::kMaxBytesPerRank);
  EXPECT_EQ(tail->start_offset(), 10);  // The first 10 bytes fell off.
  EXPECT_EQ(tail->data().substr(tail->data().size() - 10), std::string(10, 'b'));
  ASSERT_TRUE(logs.Append(2, 0, 0, "second").ok());
  ASSERT_TRUE(logs.Append(3, 0, 0, "third").ok());
  EXPECT_EQ(logs.Read(1, 0, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(logs.Read(0, 0, 0)->data(), "third");
  EXPECT_EQ(logs.Read(2, 0, 0)->data(), "second");
  logs.Shrink(2);
  EXPECT_EQ(logs.Append(3, 0, 5, std::string(RankLogs::kMaxChunkBytes + 1, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RankLogs, AGap_StartsAgainAtTheNewChunk) {
  RankLogs logs;
  ASSERT_TRUE(logs.Append(1, 0, 0, "abc").ok());
  ASSERT_TRUE(logs.Append(1, 0, 100, "xyz").ok());
  auto tail = logs.Read(1, 0, 0);
  EXPECT_EQ(tail->start_offset(), 100);
  EXPECT_EQ(tail->data(), "xyz");
}

// An ended job's tails hold what they keep, not the memory of their running days.
TEST(RankLogs, Shrink_ReleasesTheMemoryOfTheLongerTails) {
  RankLogs logs;
  for (int rank = 0; rank < 64; ++rank) {
    for (int chunk = 0; chunk < 4; ++chunk) {
      ASSERT_TRUE(logs.Append(1, rank, chunk * 40'000, std::string(40'000, 'a' + chunk)).ok());
    }
  }
  EXPECT_LE(logs.HeldBytes(), 64 * 2 * RankLogs::kMaxBytesPerRank);
  logs.Shrink(64);
  EXPECT_LE(logs.HeldBytes(), 64 * (RankLogs::kMaxBytesPerRankEnded + 64))
      << "ended tails still hold their running memory";
  auto read = logs.Read(1, 3, 0);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->data().size(), RankLogs::kMaxBytesPerRankEnded);
  EXPECT_EQ(read->end_offset(), 160'000);
  EXPECT_EQ(read->data().back(), 'd');
}

// A wide job's ended tails share a budget: 1,024 ranks keep 1 KiB each, not 16.
TEST(RankLogs, Shrink_WideJob_FitsThePerJobBudget) {
  RankLogs logs;
  for (int rank = 0; rank < 1024; ++rank) {
    ASSERT_TRUE(logs.Append(1, rank, 0, std::string(20'000, 'x')).ok());
  }
  logs.Shrink(1024);
  EXPECT_LE(logs.HeldBytes(), RankLogs::kMaxBytesPerJobEnded + 1024 * 64);
  EXPECT_EQ(logs.Read(1, 1023, 0)->data().size(), RankLogs::kMinBytesPerRankEnded);
  // Output arriving after the end keeps to it too.
  ASSERT_TRUE(logs.Append(2, 5, 0, std::string(20'000, 'y')).ok());
  EXPECT_EQ(logs.Read(2, 5, 0)->data().size(), RankLogs::kMinBytesPerRankEnded);
}

}  // namespace
}  // namespace mptrain
